"""Hydra's own report where the user asks for it (hvdtrain/launch/compose.py): with
HYDRA_FULL_ERROR=1 set before `hvdtrain` starts, a value Hydra cannot take ends in Hydra's
traceback and its exit status 1, not hvdtrain's one line. Hydra's errors as hvdtrain's:
tests/single/launch/test_compose.py."""

from support.commands import run_hvdtrain


def test_hydra_full_error_shows_hydras_own_report(tmp_path):
    result = run_hvdtrain("train.epochs=abc", cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "Error merging override train.epochs=abc" in result.stderr
