"""scripts/bench_loader_handover.py, in this process on a few small images: it prints the taking
thread's CPU and the wall time per batch, and stops when a batch's labels are not those asked for."""

import sys

import pytest
import torch

from support.scripts import load_script


@pytest.fixture
def bench(monkeypatch):
    module = load_script("bench_loader_handover")
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # this process's threads stay as they are
    monkeypatch.setattr(sys, "argv", ["bench_loader_handover.py", "--images", "16", "--batch", "4", "--workers", "1",
                                      "--epochs", "1"])
    return module


def test_the_bench_prints_the_cost_per_batch(bench, capsys):
    bench.main()
    printed = capsys.readouterr().out
    assert "the taking thread's CPU: " in printed and "wall time: " in printed


def test_the_bench_stops_when_a_batch_lost_its_samples(bench, monkeypatch):
    collate = bench.EncodedImageFolder.collate
    monkeypatch.setattr(bench.EncodedImageFolder, "collate", staticmethod(lambda samples: collate(samples[:-1])))
    with pytest.raises(SystemExit, match="labels are not those of the samples asked for"):
        bench.main()
