"""The check that one process has one CUDA major version and one NCCL (hvdtrain/core/cuda.py):
the message of each mismatch, NCCL's version codes, the libraries read from the process maps;
with the real CuPy and NCCL where the `gpu` extra is installed, that the pinned torch and CuPy
agree. A CPU-only install, in a process of its own, is in tests/parallel/core/test_cuda.py."""

import importlib.util
import textwrap

import pytest

from hvdtrain.core import cuda
from hvdtrain.core.exceptions import HorovodInternalError

CUPY = importlib.util.find_spec("cupy") is not None
needs_cupy = pytest.mark.skipif(not CUPY, reason="needs CuPy (pip install 'hvdtrain[gpu]')")


def test_matching_cuda_and_nccl_pass_the_check():
    assert cuda.library_mismatch({"torch": ("13.0", (2, 30, 7))}, 13020, 23007, ["/x/libnccl.so.2"]) is None
    assert cuda.library_mismatch({"torch": ("13.0", None)}, 13000, 0, []) is None


def test_a_cuda_major_mismatch_is_refused_naming_both_versions_and_the_extra():
    message = cuda.library_mismatch({"torch": ("12.8", (2, 26, 2))}, 13020, 23007, [])
    assert message.startswith("torch is built for CUDA 12.8 but CuPy for CUDA 13.2"), message
    assert "install hvdtrain[gpu-cu12]" in message, message
    message = cuda.library_mismatch({"torch": ("13.0", (2, 30, 7))}, 12080, 22605, [])
    assert "CUDA 13.0 but CuPy for CUDA 12.8" in message and "hvdtrain[gpu]" in message, message


def test_two_nccl_versions_or_two_nccl_files_are_refused():
    message = cuda.library_mismatch({"torch": ("13.0", (2, 30, 7))}, 13020, 22707, [])
    assert "torch uses NCCL 2.30.7 but CuPy loaded NCCL 2.27.7" in message, message
    files = ["/a/nvidia/nccl/lib/libnccl.so.2", "/b/cupy/.data/lib/libnccl.so.2"]
    assert cuda.library_mismatch({"torch": ("13.0", (2, 30, 7))}, 13020, 23007, files) == \
        f"two NCCL libraries are loaded in this process: {', '.join(files)}"


def test_nccl_version_codes_read_both_ways():
    assert cuda.nccl_code((2, 30, 7)) == 23007 and cuda.nccl_release(23007) == "2.30.7"
    assert cuda.nccl_code((2, 8, 4)) == 2804 and cuda.nccl_release(2804) == "2.8.4"
    assert cuda.nccl_code((2, 9, 9)) == 20909 and cuda.nccl_release(20909) == "2.9.9"


def test_loaded_libraries_are_read_from_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(textwrap.dedent("""\
        7f00-7f10 r-xp 00000000 08:01 1 /venv/nvidia/nccl/lib/libnccl.so.2
        7f10-7f20 r--p 00010000 08:01 1 /venv/nvidia/nccl/lib/libnccl.so.2
        7f20-7f30 r-xp 00000000 08:01 2 /venv/nvidia/cu13/lib/libcudart.so.13
        7f30-7f40 r-xp 00000000 08:01 3 /venv/lib/libnccl-net.so
        7f40-7f50 rw-p 00000000 00:00 0
        """))
    assert cuda.loaded_libraries("nccl", maps) == ["/venv/nvidia/nccl/lib/libnccl.so.2"]
    assert cuda.loaded_libraries("cudart", maps) == ["/venv/nvidia/cu13/lib/libcudart.so.13"]


@needs_cupy
def test_the_pinned_torch_and_cupy_share_one_cuda_major_and_one_nccl():
    """What init() checks on a GPU machine, with the versions of this install: the wheel the
    `gpu` extra pins is the one for the pinned torch."""
    import cupy
    import torch

    torch_nccl = tuple(torch.cuda.nccl.version())
    cupy_nccl = cuda.nccl_built()
    assert cupy_nccl == cuda.nccl_code(torch_nccl), (torch_nccl, cupy_nccl)
    assert cuda.library_mismatch({"torch": (torch.version.cuda, torch_nccl)}, cupy.cuda.runtime.runtimeGetVersion(),
                                 cupy_nccl, cuda.loaded_libraries("nccl")) is None
    assert len(cuda.loaded_libraries("nccl")) == 1


@needs_cupy
def test_init_refuses_a_framework_built_for_another_cuda(monkeypatch):
    monkeypatch.setitem(cuda._frameworks, "torch", lambda: ("12.4", None))
    with pytest.raises(HorovodInternalError, match="torch is built for CUDA 12.4 but CuPy for CUDA 13"):
        cuda.check_libraries()
    monkeypatch.setitem(cuda._frameworks, "torch", lambda: None)  # no usable GPU: nothing to check
    cuda.check_libraries()


@needs_cupy
def test_nccl_and_cuda_are_built_where_cupy_loads_nccl():
    import hvdtrain.torch as hvd

    assert hvd.cuda_built() is True
    assert hvd.nccl_built() >= 21000  # NCCL 2.10 and later code versions as 2xxyy
