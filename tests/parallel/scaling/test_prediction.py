"""A dry run's prediction imports no framework (hvdtrain/scaling/prediction.py): planning a sweep
of layouts without the network, the `hvdtrain` command never imports torch, which only a fresh
process can show (Python's import times list every module it imports). The prediction's cases:
tests/single/scaling/test_prediction.py."""

from support.commands import run_hvdtrain


def test_a_dry_run_without_the_network_imports_no_framework(tmp_path):
    result = run_hvdtrain("-m", "recipe=resnet101_synthetic", "cluster=3x1,128x4,4x4", "dry_run=true", cwd=tmp_path,
                          env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert " torch\n" not in result.stderr
