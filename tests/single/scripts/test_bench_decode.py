"""scripts/bench_decode.py, in this process on a few small images: it writes the rates of both ways
and of the rank's part in turn and ahead of a step, and stops on a wrong answer instead of timing it."""

import json
import sys

import pytest
import torch

from support.scripts import load_script


@pytest.fixture
def bench(monkeypatch):
    module = load_script("bench_decode")
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # this process's threads stay as they are
    return module


def run(bench, monkeypatch, out):
    monkeypatch.setattr(sys, "argv", ["bench_decode.py", "--images", "8", "--rounds", "2", "--size", "32",
                                      "--out", str(out)])
    bench.main()


def test_the_bench_writes_the_rates_of_each_way(bench, monkeypatch, tmp_path):
    run(bench, monkeypatch, tmp_path / "results.json")
    results = json.loads((tmp_path / "results.json").read_text())
    assert {name: len(rates) for name, rates in results["rates"].items()} == {
        "cpu": 2, "gpu, the workers' part": 2, "gpu, the rank's part on cpu": 2, "in turn with a step": 2,
        "ahead of a step": 2}
    assert results["ahead_over_in_turn"] > 0


@pytest.mark.parametrize("way", ["decode_on_cpu", "ahead"])
def test_the_bench_stops_on_a_wrong_result(bench, monkeypatch, tmp_path, way):
    right = getattr(bench, way)
    monkeypatch.setattr(bench, way, lambda *args: [(images.flip(-1), labels) for images, labels in right(*args)])
    with pytest.raises(SystemExit, match="the ways disagree"):
        run(bench, monkeypatch, tmp_path / "results.json")
