"""The GPU data plane, as far as it runs without a GPU: which transport each operation takes,
what is refused before anything is sent, the check that one process has one CUDA major version
and one NCCL, NCCL's version numbers, the fusion plan on NCCL, the agreement that every rank can
start NCCL and the exchange of its unique id over MPI (with the real CuPy and NCCL where the
`gpu` extra is installed). What needs a device is in tests/gpu/."""

import importlib.util
import textwrap

import numpy as np
import pytest

from hvdtrain.core import cuda
from hvdtrain.core.exceptions import HorovodInternalError
from hvdtrain.core.fusion import Pack, Piece
from hvdtrain.core.nccl_backend import agree_to_start, allreduce_steps, duplicate_devices, exchange_unique_id
from hvdtrain.core.requests import Kind, ReduceOp
from hvdtrain.core.settings import MIB, Settings, from_environment, ignored_variables
from hvdtrain.core.submission import Submissions

CUPY = importlib.util.find_spec("cupy") is not None
needs_cupy = pytest.mark.skipif(not CUPY, reason="needs CuPy (pip install 'hvdtrain[gpu]')")


# ----------------------------------------------------------------------------- which transport


def test_gpu_operations_default_to_nccl_and_follow_horovods_variables():
    assert from_environment({}).gpu_operations == dict.fromkeys(
        ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"], "NCCL")
    staged = from_environment({"HOROVOD_GPU_OPERATIONS": "mpi"}).gpu_operations
    assert set(staged.values()) == {"MPI"}
    mixed = from_environment({"HOROVOD_GPU_OPERATIONS": "MPI", "HOROVOD_GPU_ALLREDUCE": "NCCL",
                              "HOROVOD_GPU_ALLTOALL": "MPI"}).gpu_operations
    assert mixed == {"allreduce": "NCCL", "allgather": "MPI", "broadcast": "MPI", "alltoall": "MPI",
                     "reducescatter": "MPI"}
    assert from_environment({"HOROVOD_GPU_BROADCAST": "MPI"}).gpu_operations["broadcast"] == "MPI"


@pytest.mark.parametrize("variable", ["HOROVOD_GPU_OPERATIONS", "HOROVOD_GPU_ALLGATHER"])
def test_an_unknown_gpu_transport_is_refused_naming_the_variable(variable):
    with pytest.raises(ValueError, match=f"{variable}='GLOO' is not one of NCCL, MPI"):
        from_environment({variable: "GLOO"})


def test_the_gpu_variables_are_implemented_not_warned_about():
    env = {"HOROVOD_GPU_OPERATIONS": "MPI", "HOROVOD_GPU_REDUCESCATTER": "NCCL", "HOROVOD_GPU": "CUDA"}
    assert ignored_variables(env) == ["HOROVOD_GPU is set but not implemented by hvdtrain; ignored"]


# ----------------------------------------------------------------------------- refused at submission


class FakeDeviceArray:
    """What the submission checks read of a CuPy array, with no device behind it."""

    __cuda_array_interface__ = {}

    def __init__(self, shape, dtype, contiguous=True):
        self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)
        self.flags = type("Flags", (), {"c_contiguous": contiguous})()


def _validate(kind, array, env=None, output=None, op=ReduceOp.SUM):
    submissions = Submissions(2, (0, 1), from_environment(env or {}), is_world=True)
    return submissions._validate(kind, "t", array, output, op, 1.0, 1.0, 0, None, None)


def test_device_buffers_are_requested_as_cuda_and_host_buffers_as_cpu():
    assert _validate(Kind.ALLREDUCE, FakeDeviceArray((4, 3), np.float32)).device == "cuda"
    assert _validate(Kind.ALLREDUCE, np.zeros((4, 3), np.float32)).device == "cpu"


def test_nccl_refuses_16_bit_integers_and_names_the_way_through_host_memory():
    with pytest.raises(TypeError, match="NCCL cannot reduce dtype int16.*HOROVOD_GPU_ALLREDUCE=MPI"):
        _validate(Kind.ALLREDUCE, FakeDeviceArray((4,), np.int16))
    with pytest.raises(TypeError, match="HOROVOD_GPU_REDUCESCATTER=MPI"):
        _validate(Kind.REDUCESCATTER, FakeDeviceArray((4,), np.uint16))
    staged = _validate(Kind.ALLREDUCE, FakeDeviceArray((4,), np.int16), env={"HOROVOD_GPU_ALLREDUCE": "MPI"})
    assert (staged.device, staged.dtype) == ("cuda", "int16")
    # Moving bytes needs no reduction: NCCL gathers any dtype.
    assert _validate(Kind.ALLGATHER, FakeDeviceArray((4,), np.int16)).dtype == "int16"


def test_a_device_tensor_with_a_host_output_is_refused():
    with pytest.raises(TypeError, match="output must be a CUDA \\(CuPy\\) array like the tensor, got ndarray"):
        _validate(Kind.ALLREDUCE, FakeDeviceArray((4,), np.float32), output=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="must be contiguous"):
        _validate(Kind.ALLREDUCE, FakeDeviceArray((4,), np.float32, contiguous=False))


# ----------------------------------------------------------------------------- one runtime, one NCCL


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


def without_cupy(fake_package_dir):
    """A CPU-only install: CuPy's import fails. Host collectives work; a device buffer is refused
    naming the extra; nccl_built() and cuda_built() say no."""
    import sys

    sys.path.insert(0, fake_package_dir)
    import hvdtrain.torch as hvd
    from hvdtrain import core
    from hvdtrain.core.cuda import DeviceSupportMissing

    hvd.init()
    assert hvd.cuda_built() is False and hvd.nccl_built() == 0
    import torch

    assert hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist() == [1.0, 1.0, 1.0]
    try:
        core.allreduce_async(FakeDeviceArray((3,), np.float32), name="on_gpu")
    except DeviceSupportMissing as error:
        assert "a CUDA buffer needs CuPy" in str(error) and "hvdtrain[gpu]" in str(error), error
    else:
        raise AssertionError("a device buffer without CuPy was accepted")
    print("without cupy ok")


def test_a_cpu_only_install_works_and_refuses_device_buffers_naming_the_extra(alone, tmp_path):
    broken = tmp_path / "cupy"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('No module named cupy (hidden by the test)')\n")
    result = alone(without_cupy, str(tmp_path))
    assert "without cupy ok" in result.stdout, result.stdout


# ----------------------------------------------------------------------------- the fusion plan on NCCL


def test_nccl_reduces_large_tensors_whole_and_packs_small_ones_up_to_the_threshold():
    settings = Settings(fusion_threshold_bytes=1 * MIB, pack_below_bytes=64 * 1024)
    large = 300 * MIB // 4
    steps = allreduce_steps([large, 1000, 1000, large, 16 * 1024] + [8 * 1024] * 40, 4, settings)
    assert steps[0] == Piece(0, 0, large) and Piece(3, 0, large) in steps  # one call, however large
    assert Piece(4, 0, 16 * 1024) in steps  # 64 KiB: reduced where it lies
    packs = [s for s in steps if isinstance(s, Pack)]
    assert len(packs) == 2 and all(p.elements * 4 <= 1 * MIB for p in packs)
    assert sorted(i for p in packs for i in p.indices) == [1, 2] + list(range(5, 45))
    off = allreduce_steps([1000, 1000], 4, Settings(fusion_threshold_bytes=0))
    assert off == (Piece(0, 0, 1000), Piece(1, 0, 1000))  # HOROVOD_FUSION_THRESHOLD=0: no fusion


def test_ranks_that_share_a_gpu_are_found():
    placements = [("a", "0000:01:00.0"), ("a", "0000:02:00.0"), ("b", "0000:01:00.0"), ("a", "0000:01:00.0")]
    assert duplicate_devices(placements) == [[0, 3]]
    assert duplicate_devices(placements[:3]) == []


# ----------------------------------------------------------------------------- agreeing over MPI


def ranks_agree_to_start():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    assert agree_to_start(comm, lambda: rank * 10, "NCCL") == [0, 10, 20]

    def fails_on_rank_1():
        if rank == 1:
            raise RuntimeError("CuPy cannot load the NCCL library")
        return rank

    try:
        agree_to_start(comm, fails_on_rank_1, "NCCL")
    except HorovodInternalError as error:
        assert str(error) == "NCCL cannot start: rank 1: CuPy cannot load the NCCL library", error
    else:
        raise AssertionError(f"rank {rank} started NCCL although rank 1 cannot")
    print(f"rank {rank} agreed")


def test_every_rank_learns_that_one_cannot_start_nccl(mpirun):
    result = mpirun(3, ranks_agree_to_start, timeout=60)
    assert all(f"rank {r} agreed" in result.stdout for r in range(3)), result.stdout


def ranks_exchange_unique_ids():
    from mpi4py import MPI

    from hvdtrain.core import cuda as core_cuda

    comm = MPI.COMM_WORLD
    nccl = core_cuda.nccl()
    first, second = exchange_unique_id(comm, nccl), exchange_unique_id(comm, nccl)
    assert isinstance(first, bytes) and len(first) == 128 and first != second
    ids = comm.allgather((first, second))
    assert all(pair == ids[0] for pair in ids), "ranks got different unique ids"
    print(f"rank {comm.Get_rank()} has the id")


@needs_cupy
def test_nccls_unique_id_is_made_by_rank_0_and_reaches_every_rank(mpirun):
    result = mpirun(3, ranks_exchange_unique_ids, timeout=90)
    assert all(f"rank {r} has the id" in result.stdout for r in range(3)), result.stdout
