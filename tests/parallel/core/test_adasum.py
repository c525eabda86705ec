"""Adasum (hvdtrain/core/adasum.py) on real ranks, alone and at 2 and 4: every rank gets the
pairwise tree of Adasum's formula over the ranks' known inputs, tensor by tensor, whether the
tensors are fused or not and whatever their sizes (odd ones split unevenly by the halving); the
sum of orthogonal vectors and the average of equal ones, as Horovod's own tests ask; the scale
factors; pieces of a few elements (HVDTRAIN_CHUNK_BYTES); a process set; device buffers (the
stand-in CuPy) through host memory, combined over all ranks (through MPI) or averaged within each
host and combined across hosts (through NCCL); and the refusals: a number of ranks that is not a
power of two, integer tensors, a reducescatter.

The reference combines in float64 with straight dot products, the engine sums each tensor's dot
products piece by piece over the ranks that hold the pieces, so float64 results agree to a few
units in the last place, not bit for bit; every rank's result is the same bits.
"""

import numpy as np
import pytest
from support.adasum import adasum_reference
from support.devices import fake_gpus

from hvdtrain import core
from hvdtrain.core import ProcessSet, ReduceOp

# Sizes that halve unevenly, one that is empty and one past the 1 MiB chunk of a plain allreduce
SHAPES = ((1,), (7,), (3, 5), (0,), (2, 3, 4), (300_001,))
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-2}


def rank_input(rank, shape, salt):
    """Rank `rank`'s tensor: random, but known to every rank; they share a common direction, so
    that the pairs are neither orthogonal nor parallel."""
    generator = np.random.default_rng(1000 * salt + rank)
    common = np.random.default_rng(salt).standard_normal(shape)
    return common + generator.standard_normal(shape)


def _close(got, expected, dtype, what):
    scale = max(float(np.abs(expected).max(initial=0.0)), 1.0)
    error = float(np.abs(got.astype(np.float64) - expected).max(initial=0.0))
    assert error <= TOLERANCE[dtype] * scale, f"{what}: off by {error} (scale {scale})"


def _same_bits_everywhere(array, what):
    gathered = core.allgather_object(array.tobytes())
    assert all(g == gathered[0] for g in gathered), f"{what}: the ranks' results differ"


def every_rank_gets_the_pairwise_tree_fused_or_not_for_each_dtype():
    core.init()
    n, r = core.size(), core.rank()
    for dtype in TOLERANCE:
        inputs = [[rank_input(k, shape, salt) for k in range(n)] for salt, shape in enumerate(SHAPES)]
        # Each tensor's reference from the inputs as the dtype holds them
        expected = [adasum_reference([x.astype(dtype).astype(np.float64).reshape(-1) for x in per_rank]).reshape(shape)
                    for per_rank, shape in zip(inputs, SHAPES)]
        mine = [per_rank[r].astype(dtype) for per_rank in inputs]
        fused = [handle.wait() for handle in
                 core.grouped_allreduce_async([x.copy() for x in mine], name=f"fused.{dtype}", op=ReduceOp.ADASUM)]
        alone = [core.allreduce_async(x.copy(), name=f"alone.{dtype}.{i}", op=ReduceOp.ADASUM).wait()
                 for i, x in enumerate(mine)]
        for i, (got_fused, got_alone, want) in enumerate(zip(fused, alone, expected)):
            assert got_fused.dtype == np.dtype(dtype) and got_fused.shape == SHAPES[i]
            _close(got_fused, want, dtype, f"{dtype} {SHAPES[i]} fused")
            _close(got_alone, want, dtype, f"{dtype} {SHAPES[i]} alone")
            _same_bits_everywhere(got_fused, f"{dtype} {SHAPES[i]} fused")
    core.shutdown()


def orthogonal_vectors_are_summed_and_equal_ones_averaged():
    core.init()
    n, r = core.size(), core.rank()
    basis = np.linalg.qr(np.random.default_rng(2).standard_normal((5 * n, n)))[0]
    orthogonal = core.allreduce_async(basis[:, r].copy(), name="orthogonal", op=ReduceOp.ADASUM).wait()
    np.testing.assert_allclose(orthogonal, basis.sum(axis=1), rtol=1e-12, atol=1e-14)
    same = np.linspace(-1.0, 2.0, 11)
    equal = core.allreduce_async(same.copy(), name="equal", op=ReduceOp.ADASUM).wait()
    np.testing.assert_allclose(equal, same, rtol=1e-12)
    core.shutdown()


def scale_factors_apply_before_and_after():
    core.init()
    n, r = core.size(), core.rank()
    inputs = [rank_input(k, (9,), 7) for k in range(n)]
    got = core.allreduce_async(inputs[r].copy(), name="scaled", op=ReduceOp.ADASUM, prescale_factor=0.5,
                               postscale_factor=3.0).wait()
    np.testing.assert_allclose(got, 3.0 * adasum_reference([0.5 * x for x in inputs]), rtol=1e-12)
    core.shutdown()


def a_process_set_of_two_of_four_ranks_combines_its_own_inputs():
    evens = ProcessSet([0, 2])
    core.init(process_sets=[evens])
    r = core.rank()
    if r in (0, 2):
        inputs = [rank_input(k, (13,), 5) for k in (0, 2)]
        got = core.allreduce_async(inputs[r // 2].copy(), name="set", op=ReduceOp.ADASUM, process_set=evens).wait()
        np.testing.assert_allclose(got, adasum_reference(inputs), rtol=1e-12)
    core.shutdown()


def device_buffers_are_combined_over_all_ranks_through_mpi_and_averaged_within_this_host_through_nccl():
    """Horovod's two Adasums of GPU tensors: over all ranks where the allreduce runs on MPI; where
    it runs on NCCL, averaged within each host, then combined across hosts (here one host)."""
    for transport in ("MPI", "NCCL"):
        with fake_gpus(transport) as cupy:
            n, r = core.size(), core.rank()
            inputs = [rank_input(k, (3, 7), 11).astype(np.float32) for k in range(n)]
            array = cupy.asarray(inputs[r])
            core.allreduce_async(array, name="device", op=ReduceOp.ADASUM).wait()
            wide = [x.astype(np.float64).reshape(-1) for x in inputs]
            expected = adasum_reference(wide) if transport == "MPI" else np.mean(wide, axis=0)
            _close(array.get(), expected.reshape(3, 7), "float32", f"device through {transport}")


def across_hosts_the_averages_of_each_host_are_combined():
    """MpiBackend's Adasum within hosts first, with ranks {0, 1} and {2, 3} taken as two hosts."""
    from mpi4py import MPI

    from hvdtrain.core.mpi_backend import MpiBackend
    from hvdtrain.core.settings import from_environment

    world = MPI.COMM_WORLD
    r = world.Get_rank()
    local, cross = world.Split(r // 2, r), world.Split(r % 2, r)
    backend = MpiBackend(world, from_environment({}), adasum_hosts=(local, cross))
    inputs = [rank_input(k, (10,), 3) for k in range(4)]
    tensor = inputs[r].copy()
    backend.allreduce([tensor], [tensor], ReduceOp.ADASUM, 1.0, 1.0)
    hosts = [(inputs[0] + inputs[1]) / 2, (inputs[2] + inputs[3]) / 2]
    np.testing.assert_allclose(tensor, adasum_reference(hosts), rtol=1e-12)
    backend.close()


def what_adasum_cannot_combine_is_refused_when_submitted():
    core.init()
    n = core.size()
    if n & (n - 1):
        with pytest.raises(NotImplementedError, match=f"Adasum needs a power of two of ranks; this job has {n}"):
            core.allreduce_async(np.ones(3), name="three", op=ReduceOp.ADASUM)
    else:
        with pytest.raises(TypeError, match="Adasum combines float16, float32, float64 tensors, not int32"):
            core.allreduce_async(np.ones(3, np.int32), name="integers", op=ReduceOp.ADASUM)
        with pytest.raises(NotImplementedError, match="Adasum is an allreduce only"):
            core.reducescatter_async(np.ones(4), name="scatter", op=ReduceOp.ADASUM)
    # The engine goes on as before
    assert core.allreduce_async(np.ones(2), name="after", op=ReduceOp.SUM).wait().tolist() == [n, n]
    core.shutdown()


TREE = [every_rank_gets_the_pairwise_tree_fused_or_not_for_each_dtype,
        orthogonal_vectors_are_summed_and_equal_ones_averaged, scale_factors_apply_before_and_after,
        what_adasum_cannot_combine_is_refused_when_submitted]
DEVICE = [device_buffers_are_combined_over_all_ranks_through_mpi_and_averaged_within_this_host_through_nccl]
JOBS = {"alone": TREE, 2: TREE + DEVICE,
        4: TREE + DEVICE + [a_process_set_of_two_of_four_ranks_combines_its_own_inputs,
                            across_hosts_the_averages_of_each_host_are_combined],
        3: [what_adasum_cannot_combine_is_refused_when_submitted]}


def job(ranks, num_proc):
    return ranks.alone(JOBS["alone"]) if num_proc == "alone" else ranks.run(num_proc, JOBS[num_proc], timeout=240)


@pytest.mark.parametrize("num_proc", ["alone", 2, 4])
@pytest.mark.parametrize("check", TREE, ids=lambda check: check.__name__)
def test_adasum(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)


def test_pieces_of_a_few_elements_give_the_same_tree(ranks):
    """Adasum moves and computes in pieces of HVDTRAIN_CHUNK_BYTES: here 4 KiB, so that pieces end
    inside tensors and inside the halves at every level, for every dtype."""
    check = every_rank_gets_the_pairwise_tree_fused_or_not_for_each_dtype
    ranks.run(4, [check], env={"HVDTRAIN_CHUNK_BYTES": "4096"}, timeout=240).assert_passed(check)


def test_three_ranks_are_refused(ranks):
    job(ranks, 3).assert_passed(what_adasum_cannot_combine_is_refused_when_submitted)


def test_a_process_set_of_two_of_four_ranks_combines_its_own_inputs(ranks):
    job(ranks, 4).assert_passed(a_process_set_of_two_of_four_ranks_combines_its_own_inputs)


@pytest.mark.parametrize("num_proc", [2, 4])
def test_device_buffers_are_combined_as_in_horovod(ranks, num_proc):
    job(ranks, num_proc).assert_passed(DEVICE[0])


def test_across_hosts_the_averages_of_each_host_are_combined(ranks):
    job(ranks, 4).assert_passed(across_hosts_the_averages_of_each_host_are_combined)
