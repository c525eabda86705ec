"""`hvdtrain resume=RUN_DIR train.device=...` on a run that has not checkpointed yet
(hvdtrain/launch/resume.py): the command says the run moves to the new device, the plan shows
it, and the run's config.yaml, which the workers read, takes it only once the run may start.
Resuming real runs: tests/parallel/launch/test_resume.py."""

import pytest

from hvdtrain.launch import cli, mpirun
from hvdtrain.run import devices
from hvdtrain.run.config import ConfigError
from hvdtrain.run.plan import read_plans
from hvdtrain.run.run_dir import claim_run_dir

from support.commands import hvdtrain_here
from support.configs import compose


@pytest.fixture
def started_run(tmp_path):
    """A run directory as `hvdtrain` leaves it when its workers have not checkpointed yet."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    claim_run_dir(compose(), run_dir)
    return run_dir


@pytest.fixture
def moved_to_the_cpu(started_run, monkeypatch):
    """What `hvdtrain resume=RUN_DIR train.device=cpu dry_run=true` prints: its first line, the plan."""
    result = hvdtrain_here(f"resume={started_run}", "train.device=cpu", "dry_run=true", monkeypatch=monkeypatch)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()[0], read_plans(result.stdout)[0]


@pytest.fixture
def no_launch(monkeypatch):
    def launch(command, **options):
        raise AssertionError("launched")

    monkeypatch.setattr(mpirun, "started", launch)


def test_resume_says_the_run_goes_on_with_the_new_device(started_run, moved_to_the_cpu):
    notice, _ = moved_to_the_cpu
    assert notice == f"hvdtrain: {started_run} goes on with train.device=cpu (it was started with train.device=auto)"


def test_the_plan_of_a_moved_run_shows_its_new_device(moved_to_the_cpu):
    _, plan = moved_to_the_cpu
    assert (plan["device"], plan["device_reason"]) == ("cpu", "train.device=cpu")


def test_a_dry_run_of_a_moved_run_writes_nothing(started_run, moved_to_the_cpu):
    assert "  device: auto\n" in (started_run / "config.yaml").read_text()


def test_a_device_refused_on_resume_leaves_the_saved_config_as_it_was(started_run, no_launch, monkeypatch):
    monkeypatch.setattr(devices, "visible_gpus", lambda framework: 0)
    with pytest.raises(ConfigError, match="no CUDA device visible"):
        cli.run(compose(f"resume={started_run}", "train.device=cuda"), started_run)
    assert "  device: auto\n" in (started_run / "config.yaml").read_text()


def test_resume_writes_the_new_device_into_the_run_once_it_may_start(started_run, no_launch):
    """The workers read config.yaml: the command writes the new device there, after its checks."""
    with pytest.raises(AssertionError, match="launched"):
        cli.run(compose(f"resume={started_run}", "train.device=cpu"), started_run)
    assert "  device: cpu\n" in (started_run / "config.yaml").read_text()
