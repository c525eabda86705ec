"""Calibrates the scaling model (hvdtrain/runner/scaling.py) on this machine, then checks its
predictions against training that really runs (issue 18; `make calibrate`).

    python scripts/calibrate_scaling.py [--quick] [--output FILE] [RECIPE OVERRIDES...]

It makes hosts of network namespaces, as the cluster tests do (tests/cluster/netns_cluster.py),
and for each link rate:
  1. shapes every host's link to the rate with tc's token bucket (tbf), both ways: each host has
     a full-duplex link of that rate to a switch (the bridge). netem is missing here, so no
     latency is added: a TCP probe measures the link's own round trip, and how fast one stream
     really goes;
  2. times the engine's allreduce (hvdtrain.core, float32, a median of repeats after warm-up,
     as scripts/bench_allreduce.py) for each size on 2, 3 and 4 hosts of one rank, and fits the
     ring formula's bandwidth and latency (scaling.fit_link), with each measurement's residual;
  3. trains the recipe (default: the synthetic recipe's ResNet-50 on 32 x 32 images, 8 a rank)
     on 2 x 1, 3 x 1 and 2 x 2 ranks (hosts x slots) in rounds of two phases, each rank alone
     (compute, no communication) and data-parallel through hvdtrain.torch
     (scripts/calibration_jobs.py), and predicts each layout's throughput from the fitted
     links, the model's gradient sizes and the compute time measured with as many ranks
     computing at once: all ranks share this machine's 2 cores, so 4 ranks compute a step in
     about twice the time of 2; and how much backward and the allreduce slow each other when
     they run side by side on those cores (the overlap phase), which the prediction takes too.
The link between ranks of one host (shared memory) is fitted once, from one host of 2 ranks.
The results (links, every measurement, predictions against measurements and their errors) go to
studies/scaling_calibration/calibration.json and a table to stdout. --quick: 2 sizes, one rate,
2 layouts, one round (checks the pipeline in well under a minute; written to quick.json).
It takes about 10 minutes on 2 quiet cores (the ranks of every host share them), longer while
other jobs run. Everything it makes is removed at the end, also on an error, Ctrl-C or SIGTERM.
Needs root, iproute2 (ip, tc) and util-linux (unshare, mount).
"""

import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple

from hvdtrain.core.settings import Settings
from hvdtrain.launch import mpirun as launcher
from hvdtrain.scaling import step_time as scaling

REPOSITORY = Path(__file__).resolve().parent.parent
JOBS = REPOSITORY / "scripts" / "calibration_jobs.py"
STUDY = REPOSITORY / "studies" / "scaling_calibration"
KIB, MIB = 1 << 10, 1 << 20
STARTED = time.monotonic()

# ResNet-50's 102 MB of gradients in 161 tensors, against about a second of compute a step on one
# core: communication is as long as compute at 1 Gbit/s. A model of the digits or MNIST-1D
# recipes (at most 0.12 MB of gradients) would pass a step's gradients within the token
# bucket's burst, which the link never holds back.
DEFAULT_RECIPE = ("recipe=synthetic", "model=resnet50", "data.image_size=32", "data.resize_size=32",
                  "train.batch_size=8")
# tbf lets this many bytes through at once before it holds to its rate; 64 KiB or less cut what one
# TCP stream carries at 1 Gbit/s to a half or less here (kernel timers are too coarse for less).
BURST_BYTES = 128 * KIB
QUEUE_DELAY_MS = 5  # tbf's queue: what may wait this long at the rate; more is dropped


@dataclass(frozen=True)
class Extent:
    """How much a calibration measures."""
    rates_gbps: Tuple[float, ...]
    sizes: Tuple[int, ...]  # allreduce bytes
    allreduce_hosts: Tuple[int, ...]  # hosts of one rank each
    layouts: Tuple[Tuple[int, int], ...]  # (hosts, slots) trained on
    sweep_rounds: int
    sweep_warmup: int
    sweep_repeats: int
    training_rounds: int
    training_steps: int  # timed steps of each phase of a round
    training_warmup: int
    overlap_allreduces: int  # at least this many of one step's gradient bytes beside backward, each round
    probe_seconds: float
    job_timeout_s: int  # a job that hangs fails the calibration after this long


# The rates: one TCP stream between two hosts carried 0.95 Gbit/s at a 1 Gbit/s tbf and 4.1 at
# 5 (7 unshaped), but four at once, host to host around a ring as the allreduce sends, carried
# 1.8 each at 2 Gbit/s and 2.3 at 3: beyond about 2 Gbit/s the 2 cores, not the links, set the pace.
# The sizes span a step's fused buffers, from one small tensor's (where the latency shows) to the
# tens of MB that a cycle fuses of a large model's gradients (where the bandwidth does).
FULL = Extent(rates_gbps=(1.0, 2.0), sizes=tuple(size * KIB for size in (4, 32, 256, 2048, 8192, 32768)),
              allreduce_hosts=(2, 3, 4), layouts=((2, 1), (3, 1), (2, 2)), sweep_rounds=3, sweep_warmup=1,
              sweep_repeats=3, training_rounds=3, training_steps=2, training_warmup=1, overlap_allreduces=3,
              probe_seconds=1.0, job_timeout_s=600)
# --quick trains on two layouts of 2 ranks, one across hosts and one within a host: each rank of a
# training job starts PyTorch, which takes seconds. Its large size must take well over the engine's
# millisecond or two a call even over shared memory (about 5 ms at 7 GB/s), or the fit can find no
# bandwidth in the noise and report an infinite one (seen with 4 MiB).
QUICK = Extent(rates_gbps=(1.0,), sizes=(4 * KIB, 32 * MIB), allreduce_hosts=(2,), layouts=((2, 1), (1, 2)),
               sweep_rounds=1, sweep_warmup=1, sweep_repeats=2, training_rounds=1, training_steps=1, training_warmup=1,
               overlap_allreduces=2, probe_seconds=0.3, job_timeout_s=120)


def load_netns_cluster():
    """tests/cluster/netns_cluster.py, the one place that knows how to make the hosts."""
    path = REPOSITORY / "tests" / "cluster" / "netns_cluster.py"
    spec = importlib.util.spec_from_file_location("netns_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


netns = load_netns_cluster()


class CalibrationError(Exception):
    pass


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 sizes, 1 rate, 2 layouts, 1 round")
    parser.add_argument("--output", type=Path, help="the JSON file (default: studies/scaling_calibration/"
                                                    "calibration.json, quick.json with --quick)")
    parser.add_argument("overrides", nargs="*", default=list(DEFAULT_RECIPE),
                        help=f"hvdtrain overrides of the recipe trained (default: {' '.join(DEFAULT_RECIPE)})")
    args = parser.parse_args()
    extent = QUICK if args.quick else FULL
    # SIGTERM unwinds like Ctrl-C, so that the hosts and any running job are removed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        missing = netns.missing_requirements()
        if missing:
            raise CalibrationError(missing)
        with tempfile.TemporaryDirectory(prefix="hvdtrain-calibration-hosts-") as private, \
                netns.netns_cluster(hosts_needed(extent), private) as cluster:
            result = calibrate(cluster, extent, args.overrides)
    except (CalibrationError, RuntimeError) as error:  # RuntimeError: netns_cluster's, one line each
        raise SystemExit(f"calibrate_scaling: {error}") from None
    except KeyboardInterrupt:
        raise SystemExit("calibrate_scaling: interrupted; the hosts it made are removed") from None
    output = args.output or STUDY / ("quick.json" if args.quick else "calibration.json")
    write(result, output)
    print_tables(result)
    print(f"written to {output}")


def say(text):
    print(f"[{time.monotonic() - STARTED:5.0f} s] {text}", flush=True)


def hosts_needed(extent):
    return max([*extent.allreduce_hosts, *(hosts for hosts, _ in extent.layouts)])


def calibrate(cluster, extent, overrides):
    """Everything measured, fitted and predicted on `cluster` (a netns_cluster.NetnsCluster of at
    least hosts_needed(extent) hosts, whose links it leaves unshaped again), as one dict."""
    if shutil.which("tc") is None:
        raise CalibrationError("shaping links needs tc (iproute2) on PATH")
    began = time.monotonic()
    # Every host reads the recipe's config here: outside the cluster's private directory.
    with tempfile.TemporaryDirectory(prefix="hvdtrain-calibration-") as work:
        work = Path(work)
        config = compose_recipe(overrides, work)
        within = fit_within_host(cluster, extent, work)
        links, training = [], []
        try:
            for rate in extent.rates_gbps:
                shape_links(cluster, rate)
                link = measure_link(cluster, rate, extent, work)
                links.append(link)
                network = scaling.Network(across=scaling.Link(**link["fitted"]),
                                          within=scaling.Link(**within["fitted"]))
                training += [train_and_predict(cluster, rate, layout, network, extent, config, work)
                             for layout in extent.layouts]
        finally:
            unshape_links(cluster)
    return {"quick": extent == QUICK, "recipe_overrides": list(overrides), "cores": os.cpu_count(),
            "engine": {"fusion_threshold_bytes": Settings.fusion_threshold_bytes,
                       "cycle_time_s": Settings.cycle_time_s},
            "tbf": {"burst_bytes": BURST_BYTES, "queue_delay_ms": QUEUE_DELAY_MS},
            "within_host": within, "links": links, "training": training,
            "duration_s": round(time.monotonic() - began, 1)}


def write(result, output):
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1) + "\n")


def compose_recipe(overrides, work):
    """The recipe's config, resolved, as `hvdtrain` composes it, in a file every host reads."""
    command = [sys.executable, "-m", "hvdtrain.launch.cli", *overrides, "--cfg", "job", "--resolve"]
    composed = subprocess.run(command, cwd=work, capture_output=True, text=True)
    if composed.returncode != 0:
        raise CalibrationError(f"hvdtrain {' '.join(overrides)}: {last_line(composed.stderr + composed.stdout)}")
    path = work / "config.yaml"
    path.write_text(composed.stdout)
    return path


def shape_links(cluster, rate_gbps):
    """Both ends of every host's veth pair: the host's eth0 shapes what it sends, the bridge's
    end what it receives."""
    tbf = ["tbf", "rate", f"{rate_gbps * 1e9:.0f}bit", "burst", str(BURST_BYTES), "latency", f"{QUEUE_DELAY_MS}ms"]
    for host in cluster.hosts:
        tc("-n", host.namespace, "qdisc", "replace", "dev", "eth0", "root", *tbf)
        tc("qdisc", "replace", "dev", host.link, "root", *tbf)


def unshape_links(cluster):
    for host in cluster.hosts:
        tc("-n", host.namespace, "qdisc", "del", "dev", "eth0", "root", unshaped_ok=True)
        tc("qdisc", "del", "dev", host.link, "root", unshaped_ok=True)


def tc(*args, unshaped_ok=False):
    """`unshaped_ok`: deleting the qdisc of a link that has only its default one is no error."""
    result = subprocess.run(["tc", *args], capture_output=True, text=True)
    if result.returncode != 0 and not (unshaped_ok and "handle of zero" in result.stderr):
        raise CalibrationError(f"`tc {' '.join(args)}` failed: {result.stderr.strip()}")


def measure_link(cluster, rate_gbps, extent, work):
    probe = probe_link(cluster, extent, work)
    measured = [measurement for hosts in extent.allreduce_hosts
                for measurement in allreduce_sweep(cluster, [(host, 1) for host in cluster.hosts[:hosts]], extent, work)]
    link = fit(measured)
    say(f"{rate_gbps:g} Gbit/s: TCP {probe['tcp_gbps']:.2f} Gbit/s, round trip {probe['round_trip_us']:.0f} us; "
        f"fitted {link['fitted']['gbps']:.3g} Gbit/s, {link['fitted']['latency_us']:.3g} us a step")
    return {"rate_gbps": rate_gbps, "probe": probe, **link}


def fit_within_host(cluster, extent, work):
    """The link between ranks of one host: shared memory, which no tc shapes."""
    link = fit(allreduce_sweep(cluster, [(cluster.hosts[0], 2)], extent, work))
    say(f"within a host: fitted {link['fitted']['gbps']:.3g} Gbit/s, {link['fitted']['latency_us']:.3g} us a step")
    return link


def fit(measured):
    """The link fitted to allreduces measured as [{ranks, nbytes, seconds}], and the measurements
    with what the fitted ring formula gives for each and the relative difference (measured /
    fitted - 1)."""
    link = scaling.fit_link([(m["ranks"], m["nbytes"], m["seconds"]) for m in measured])
    rows = []
    for m in measured:
        fitted_s = scaling.ring_allreduce_s(m["nbytes"], m["ranks"], link)
        rows.append({**m, "fitted_seconds": fitted_s, "residual": m["seconds"] / fitted_s - 1})
    return {"fitted": {"gbps": link.gbps, "latency_us": link.latency_us}, "allreduce": rows}


def probe_link(cluster, extent, work):
    """Round trips and one stream from the first host to the second."""
    sender, receiver = cluster.hosts[:2]
    spec = json.dumps({"address": receiver.address, "seconds": extent.probe_seconds})
    server = subprocess.Popen(["ip", "netns", "exec", receiver.namespace, sys.executable, "-u", str(JOBS),
                               "link_server", spec, os.devnull], stdout=subprocess.PIPE, text=True)
    output = work / "probe.json"
    try:
        if server.stdout.readline().strip() != "listening":
            raise CalibrationError(f"the link probe's server on {receiver.address} did not start")
        client = subprocess.run(["ip", "netns", "exec", sender.namespace, sys.executable, str(JOBS), "link_client",
                                 spec, str(output)], capture_output=True, text=True, timeout=extent.job_timeout_s)
    except subprocess.TimeoutExpired:
        raise CalibrationError(f"the link probe from {sender.address} to {receiver.address} did not finish in "
                               f"{extent.job_timeout_s} s") from None
    finally:
        server.kill()  # done once the client is (it waits for the server to close), or of no more use
        server.wait()
    if client.returncode != 0:
        raise CalibrationError(f"the link probe from {sender.address} failed: {last_line(client.stderr)}")
    return json.loads(output.read_text())


def allreduce_sweep(cluster, layout, extent, work):
    """[{ranks, nbytes, seconds}] of the engine's allreduce on `layout`, [(host, ranks there)]."""
    spec = {"sizes": list(extent.sizes), "rounds": extent.sweep_rounds, "warmup": extent.sweep_warmup,
            "repeats": extent.sweep_repeats}
    result = run_job(cluster, layout, "allreduce", spec, extent, work)
    return [{"ranks": result["ranks"], "nbytes": nbytes, "seconds": seconds} for nbytes, seconds in result["seconds"]]


def train_and_predict(cluster, rate_gbps, layout, network, extent, config, work):
    hosts, slots = layout
    spec = {"config": str(config), "rounds": extent.training_rounds, "steps": extent.training_steps,
            "warmup": extent.training_warmup, "overlap_allreduces": extent.overlap_allreduces}
    result = run_job(cluster, [(host, slots) for host in cluster.hosts[:hosts]], "training", spec, extent, work)
    rounds = result["rounds"]
    workload = scaling.Workload(
        samples_per_step=result["samples_per_step"],
        compute_s=statistics.median(r["alone"]["step_s"] for r in rounds),
        backward_fraction=statistics.median(backward_share(r["alone"]) for r in rounds),
        gradient_bytes=tuple(result["gradient_bytes"]))
    overlap = scaling.Overlap(*(statistics.median(r["overlap"][key] for r in rounds)
                                for key in ("compute_slowdown", "communication_slowdown")))
    measured_step_s = statistics.median(r["parallel"]["step_s"] for r in rounds)
    measured = hosts * slots * workload.samples_per_step / measured_step_s
    hierarchical = scaling.HIERARCHICAL["cpu"]
    predicted_step_s = scaling.step_s(workload, hosts, slots, network, hierarchical=hierarchical, overlap=overlap)
    predicted = hosts * slots * workload.samples_per_step / predicted_step_s
    independent = scaling.samples_per_s(workload, hosts, slots, network, hierarchical=hierarchical)
    row = {"rate_gbps": rate_gbps, "hosts": hosts, "slots": slots, "threads_per_rank": result["threads_per_rank"],
           "samples_per_step": workload.samples_per_step, "gradient_bytes": sum(workload.gradient_bytes),
           "gradient_tensors": len(workload.gradient_bytes), "compute_s": workload.compute_s,
           "backward_fraction": workload.backward_fraction, "measured_step_s": measured_step_s,
           "predicted_step_s": predicted_step_s,
           "measured_samples_per_s": measured, "predicted_samples_per_s": predicted,
           "error": predicted / measured - 1,
           # On shared cores the allreduce that overlaps backward takes CPU from it (the sending,
           # the reductions, the engine's thread), and backward from the allreduce: measured
           # side by side (the overlap phase) for the prediction, and in the training itself.
           "overlap": {"compute_slowdown": overlap.compute_slowdown,
                       "communication_slowdown": overlap.communication_slowdown},
           "error_if_overlap_were_free": independent / measured - 1,
           "compute_slowdown_in_parallel": statistics.median(
               computing_s(r["parallel"]) / computing_s(r["alone"]) - 1 for r in rounds),
           "rounds": rounds}
    say(f"{rate_gbps:g} Gbit/s, {hosts}x{slots}: compute {workload.compute_s * 1e3:.0f} ms, step "
        f"{measured_step_s * 1e3:.0f} ms; {measured:.3g} samples/s, predicted {predicted:.3g} ({row['error']:+.1%})")
    return row


def backward_share(phase):
    return phase["backward_s"] / (phase["forward_s"] + phase["backward_s"] + phase["update_s"])


def computing_s(phase):
    """Forward and backward: the update of a data-parallel step includes its wait for the allreduce."""
    return phase["forward_s"] + phase["backward_s"]


def run_job(cluster, layout, job, spec, extent, work):
    """Run a job of calibration_jobs.py under mpirun on `layout`, [(host, ranks there)]; rank 0's result."""
    output = work / f"{job}.json"
    output.unlink(missing_ok=True)
    ranks = sum(count for _, count in layout)
    # Every host is this machine: the ranks of all of them share its cores.
    environment = launcher.worker_environment(ranks)
    command = launcher.mpirun_command([sys.executable, "-u", str(JOBS), job, json.dumps(spec), str(output)],
                                      hosts=[launcher.Host(host.address, count) for host, count in layout],
                                      env=environment, extra_args=cluster.mpirun_args())
    where = "+".join(str(count) for _, count in layout) + f" ranks on {len(layout)} host(s)"
    try:
        finished = launcher.run(command, env=environment, timeout=extent.job_timeout_s, capture=True)
    except subprocess.TimeoutExpired:
        raise CalibrationError(f"the {job} job on {where} did not finish in {extent.job_timeout_s} s") from None
    if finished.returncode != 0 or not output.exists():
        print(finished.stdout, file=sys.stderr)
        raise CalibrationError(f"the {job} job on {where} failed (exit {finished.returncode}); its output is above")
    return json.loads(output.read_text())


def last_line(text):
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def print_tables(result):
    print("\nLinks: the rate tbf holds each host's link to; one TCP stream and its round trip; the engine's "
          "allreduce fitted to the ring formula, and the largest residual of the fit")
    print(f"{'rate':>8} {'TCP':>8} {'round trip':>11} {'fitted':>10} {'latency':>10} {'max |residual|':>15}")
    for link in result["links"]:
        print(f"{link['rate_gbps']:>6g} G {link['probe']['tcp_gbps']:>6.2f} G {link['probe']['round_trip_us']:>8.0f} us "
              f"{link['fitted']['gbps']:>8.3g} G {link['fitted']['latency_us']:>7.0f} us "
              f"{largest_residual(link):>14.0%}")
    within = result["within_host"]
    print(f"{'within':>8} {'':>8} {'':>11} {within['fitted']['gbps']:>8.3g} G {within['fitted']['latency_us']:>7.0f} us "
          f"{largest_residual(within):>14.0%}")
    print("\nTraining: a step's compute (every rank alone), the data-parallel step measured and predicted, the "
          "throughputs (samples/s) and the prediction's error (and its error if overlap were free); overlap: "
          "how much slower backward and the allreduce ran side by side (the model's input); slowdown: how much "
          "longer forward and backward took in the data-parallel steps")
    print(f"{'rate':>8} {'layout':>7} {'compute':>10} {'step':>10} {'predicted':>10} {'samples/s':>10} "
          f"{'predicted':>10} {'error':>7} {'if free':>8} {'overlap':>12} {'slowdown':>9}")
    for row in result["training"]:
        overlap = f"{row['overlap']['compute_slowdown']:.2f}/{row['overlap']['communication_slowdown']:.2f}"
        print(f"{row['rate_gbps']:>6g} G {row['hosts']:>5}x{row['slots']} {row['compute_s'] * 1e3:>7.0f} ms "
              f"{row['measured_step_s'] * 1e3:>7.0f} ms {row['predicted_step_s'] * 1e3:>7.0f} ms "
              f"{row['measured_samples_per_s']:>10.3g} {row['predicted_samples_per_s']:>10.3g} {row['error']:>+7.0%} "
              f"{row['error_if_overlap_were_free']:>+8.0%} {overlap:>12} {row['compute_slowdown_in_parallel']:>+9.0%}")


def largest_residual(fitted_link):
    return max(abs(m["residual"]) for m in fitted_link["allreduce"])


if __name__ == "__main__":
    main()
