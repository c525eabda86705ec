"""The calibration of the scaling model (scripts/calibrate_scaling.py, `make calibrate`) in its
quickest form on the cluster's hosts: it fits the links, predicts training and writes it all
down. No figure is checked against a bound: timings on a shared 2-core machine are not stable."""

import json
import math
import subprocess

from support.scripts import load_script

# The pipeline as --quick runs it, on the digits recipe's model, which trains in milliseconds.
RECIPE = ("recipe=digits",)


def test_the_quick_calibration_fits_links_and_predicts_training(netns_cluster, tmp_path):
    calibration = load_script("calibrate_scaling")
    output = tmp_path / "calibration.json"
    calibration.write(calibration.calibrate(netns_cluster, calibration.QUICK, RECIPE), output)

    result = json.loads(output.read_text())
    assert result["quick"] is True and result["recipe_overrides"] == list(RECIPE)
    fitted_links = [result["within_host"]["fitted"]] + [link["fitted"] for link in result["links"]]
    for link in fitted_links:
        assert 0 < link["gbps"] < math.inf and link["latency_us"] > 0, result
    (link,) = result["links"]
    assert link["rate_gbps"] == calibration.QUICK.rates_gbps[0]
    assert link["probe"]["tcp_gbps"] > 0 and link["probe"]["round_trip_us"] > 0
    sweep = {(m["ranks"], m["nbytes"]) for m in link["allreduce"]}
    assert sweep == {(2, nbytes) for nbytes in calibration.QUICK.sizes}
    for m in link["allreduce"]:
        assert m["seconds"] > 0 and math.isclose(m["residual"], m["seconds"] / m["fitted_seconds"] - 1)

    assert [(row["hosts"], row["slots"]) for row in result["training"]] == list(calibration.QUICK.layouts)
    for row in result["training"]:
        assert row["gradient_bytes"] > 0 and row["compute_s"] > 0 and 0 < row["backward_fraction"] < 1
        ranks = row["hosts"] * row["slots"]
        assert math.isclose(row["measured_samples_per_s"], ranks * row["samples_per_step"] / row["measured_step_s"])
        assert math.isclose(row["error"], row["predicted_samples_per_s"] / row["measured_samples_per_s"] - 1)
        assert len(row["rounds"]) == calibration.QUICK.training_rounds
        # Backward and the allreduce side by side, measured: the prediction's input.
        assert all(r["overlap"]["steps_overlapped"] >= 1 for r in row["rounds"])
        assert row["overlap"]["compute_slowdown"] > 0 and row["overlap"]["communication_slowdown"] > 0

    # The links are the session's: left as they were found, unshaped.
    for host in netns_cluster.hosts:
        assert "tbf" not in qdiscs(host)


def qdiscs(host):
    """What `tc` shows of both ends of the host's link."""
    inside = subprocess.run(["tc", "-n", host.namespace, "qdisc", "show", "dev", "eth0"], capture_output=True,
                            text=True, check=True).stdout
    outside = subprocess.run(["tc", "qdisc", "show", "dev", host.link], capture_output=True, text=True,
                             check=True).stdout
    return inside + outside
