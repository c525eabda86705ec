"""Rank 0's requeue of its Slurm job after a preemption notice (hvdtrain/training/
fault_tolerance.py), with an `scontrol` of the test's own: it asks Slurm to requeue the job and
says so, or says what to do where Slurm refuses. Preempted runs: tests/parallel/training/
test_fault_tolerance.py."""

import os
import stat

import pytest

from hvdtrain.training import fault_tolerance


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """scontrol(status): an `scontrol` first on PATH, inside Slurm job 4711, that records its
    arguments in tmp_path/calls and exits with `status`."""
    def install(status):
        folder = tmp_path / "bin"
        folder.mkdir(exist_ok=True)
        script = folder / "scontrol"
        script.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\necho 'Job is not requeueable' >&2\n"
                          f"exit {status}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
        monkeypatch.setenv("SLURM_JOB_ID", "4711")

    return install


def test_rank_0_requeues_its_job_with_scontrol(scontrol, tmp_path):
    scontrol(0)
    fault_tolerance.requeue_job()
    assert (tmp_path / "calls").read_text() == "requeue 4711\n"


def test_rank_0_says_it_requeued_its_job(scontrol, capsys):
    scontrol(0)
    fault_tolerance.requeue_job()
    assert capsys.readouterr().out == "hvdtrain: requeued Slurm job 4711; it resumes from this checkpoint\n"


def test_a_refused_requeue_says_how_to_continue(scontrol, capsys):
    scontrol(1)
    fault_tolerance.requeue_job()
    assert capsys.readouterr().err == ("hvdtrain: could not requeue Slurm job 4711 (scontrol requeue: Job is not "
                                       "requeueable); continue it with a job that runs `hvdtrain resume=RUN_DIR`\n")
