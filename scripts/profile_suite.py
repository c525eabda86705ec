"""Where `make test`'s time goes: the suite run as `make test` runs it, with each test's start and
end recorded by its xdist worker and the machine's CPU use sampled from /proc/stat, then summed
per test file: its seconds on a worker and the share of them the machine's cores sat idle.

A file whose tests leave the cores idle waits (for Slurm, a stall limit, a shaped link); a
file that keeps them busy costs CPU, which on a 2-core machine running 2 workers is what the
suite's wall time is made of. Results: studies/suite_time/profile.json and the table printed.

    .venv/bin/python scripts/profile_suite.py PYTEST_ARGUMENTS

`make suite-profile` passes make test's (`-n 2 --dist loadgroup tests/single tests/parallel
tests/gpu`); `... tests/integration`, or `tests/cluster`, profiles the other two targets.

The same file is the pytest plugin (`-p profile_suite`) that records the tests' times."""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "studies" / "suite_time"
TIMES_DIR_VARIABLE = "PROFILE_SUITE_TIMES_DIR"
SAMPLE_EVERY_S = 0.5


# ----------------------------------------------------------------------------- the pytest plugin


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = time.time()
    times_dir = os.environ[TIMES_DIR_VARIABLE]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    yield
    with open(Path(times_dir) / f"{worker}.tsv", "a") as times:
        times.write(f"{item.nodeid}\t{started}\t{time.time()}\n")


# ----------------------------------------------------------------------------- the run and its table


def cpu_counters():
    """(all jiffies, idle jiffies) of the machine since boot."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]  # idle and iowait


def sample_cpu(samples, stop):
    while not stop.wait(SAMPLE_EVERY_S):
        samples.append((time.time(), *cpu_counters()))


def idle_share(samples, start, end):
    """The share of the cores idle between start and end, from the samples that span it."""
    seconds = idle = 0.0
    for (t0, all0, idle0), (t1, all1, idle1) in zip(samples, samples[1:], strict=False):
        overlap = min(end, t1) - max(start, t0)
        if overlap > 0 and all1 > all0:
            seconds += overlap
            idle += overlap * (idle1 - idle0) / (all1 - all0)
    return idle / seconds if seconds else 0.0


def checkout_commit():
    """The commit the profile measured (None outside a git checkout)."""
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return result.stdout.strip() or None


def main():
    pytest_args = sys.argv[1:]
    if not pytest_args:
        sys.exit("profile_suite: give the pytest arguments to profile (make suite-profile gives make test's)")
    times_dir = Path(tempfile.mkdtemp(prefix="profile_suite."))
    path = os.pathsep.join(filter(None, [str(ROOT / "scripts"), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, **{TIMES_DIR_VARIABLE: str(times_dir)})
    samples, stop = [(time.time(), *cpu_counters())], threading.Event()
    sampler = threading.Thread(target=sample_cpu, args=(samples, stop), daemon=True)
    sampler.start()
    started = time.time()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "profile_suite", *pytest_args],
                            cwd=ROOT, env=env)
    wall = time.time() - started
    stop.set()
    sampler.join()
    OUT.mkdir(parents=True, exist_ok=True)

    files = defaultdict(lambda: {"seconds": 0.0, "idle_seconds": 0.0, "tests": 0})
    for times in times_dir.glob("*.tsv"):
        for line in times.read_text().splitlines():
            nodeid, start, end = line.split("\t")
            start, end = float(start), float(end)
            entry = files[nodeid.split("::")[0]]
            entry["seconds"] += end - start
            entry["idle_seconds"] += (end - start) * idle_share(samples, start, end)
            entry["tests"] += 1
    table = sorted(({"file": name, "seconds": round(e["seconds"], 1), "tests": e["tests"],
                     "idle_share": round(e["idle_seconds"] / e["seconds"], 3) if e["seconds"] else 0.0}
                    for name, e in files.items()), key=lambda row: -row["seconds"])
    profile = {"date": time.strftime("%Y-%m-%d"), "commit": checkout_commit(), "pytest_args": pytest_args,
               "exit_status": result.returncode,
               "wall_s": round(wall, 1), "cpus": os.cpu_count(),
               "idle_share": round(idle_share(samples, started, started + wall), 3),
               "worker_seconds": round(sum(row["seconds"] for row in table), 1), "files": table}
    (OUT / "profile.json").write_text(json.dumps(profile, indent=1) + "\n")
    print(f"\nwall {profile['wall_s']} s on {profile['cpus']} CPUs, cores idle {profile['idle_share']:.1%}; "
          f"{profile['worker_seconds']} s of tests on the workers; per file (seconds, tests, cores idle):")
    for row in table[:30]:
        print(f"{row['seconds']:8.1f} {row['tests']:5d} {row['idle_share']:6.1%}  {row['file']}")
    print(f"profile_suite: {OUT / 'profile.json'}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
