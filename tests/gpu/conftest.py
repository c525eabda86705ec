"""The GPU tests: run where torch sees a CUDA device and CuPy (the `gpu` extra) loads NCCL;
skipped elsewhere, each with the reason. scripts/gpu_check.sh runs them with the benchmarks."""

import importlib.util
from pathlib import Path

import pytest


def _missing():
    """What this machine lacks for the GPU tests, or None."""
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False)"
    if importlib.util.find_spec("cupy") is None:
        return "needs CuPy: pip install 'hvdtrain[gpu]'"
    from hvdtrain.core import cuda

    if not cuda.nccl_built():
        return "needs CuPy with NCCL (hvdtrain.core.cuda.nccl_built() is 0)"
    return None


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    gpu_items = [item for item in items if here in Path(str(item.fspath)).resolve().parents]
    if not gpu_items:
        return
    missing = _missing()
    if missing:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=missing))
