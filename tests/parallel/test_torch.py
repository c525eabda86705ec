"""hvdtrain.torch, the drop-in for horovod.torch, on real ranks. Its collectives
(hvdtrain/torch/mpi_ops.py) on 2 and 3 ranks: exact results for every dtype; Horovod's signatures
and return values (in place, async, poll, the deprecated `average`, alltoall with and without
splits); Horovod's gradients through every collective, grouped ones and the scale factors
included; the scale factors per dtype exactly as Horovod computes them; sparse allreduce; join;
errors on every rank when ranks disagree. broadcast_optimizer_state (functions.py) leaves
Horovod's zero gradients; SyncBatchNorm (sync_batch_norm.py) normalizes on 3 ranks as BatchNorm2d
over the whole batch. A script written for Horovod runs unchanged on two ranks except for its
import line (torch/scripts/horovod_digits.py), with fp16 compression and with Adasum, and
importing hvdtrain.torch imports torch, not TensorFlow. DistributedOptimizer, and the
collectives' gradients within process sets (checked where its pairs of ranks train), are in
tests/parallel/torch/test_optimizer.py; Adasum in tests/parallel/torch/test_adasum_optimizer.py.

Each job of ranks runs all the checks of its size: starting torch on every rank costs seconds."""

import ast
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import hvdtrain.torch as hvd
from hvdtrain.launch import mpirun as launcher


# ----------------------------------------------------------------------------- the drop-in promise

SCRIPT = Path(__file__).parent / "torch" / "scripts" / "horovod_digits.py"


def test_only_the_import_line_differs_from_horovod():
    lines = SCRIPT.read_text().splitlines()
    assert "import hvdtrain.torch as hvd" in lines
    assert not [line for line in lines if "hvdtrain" in line and line != "import hvdtrain.torch as hvd"
                and not line.startswith(("`", "Its only", "\"\"\""))]


@pytest.mark.parametrize("flags", [["--fp16-allreduce"], ["--use-adasum"]], ids=" ".join)
def test_horovod_script_trains_on_two_ranks(flags):
    env = launcher.worker_environment(2)
    if "--use-adasum" in flags:
        # Adasum splits a fused buffer between the ranks where the tensors a cycle happened to
        # gather put the halves, so its rounding, and this short run's last epoch, follow the
        # timing: about one run in ten ended at 87.11 %, the others above 90 %. Unfused, the run
        # is the same every time (96.00 %); fused Adasum is checked bit for bit in
        # tests/parallel/core/test_adasum.py.
        env["HOROVOD_FUSION_THRESHOLD"] = "0"
    command = launcher.mpirun_command([sys.executable, "-u", str(SCRIPT), *flags], num_proc=2, env=env)
    result = launcher.run(command, env=env, timeout=180, capture=True)
    assert result.returncode == 0, result.stdout
    accuracies = [float(a) for a in re.findall(r"Accuracy: ([\d.]+)%", result.stdout)]
    assert len(accuracies) == 6, result.stdout
    assert accuracies[-1] > 90.0, result.stdout
    assert "weights identical on all ranks: True" in result.stdout


def test_importing_it_imports_torch_and_not_tensorflow():
    code = "import hvdtrain.torch\nimport sys\nprint(sorted({name.split('.')[0] for name in sys.modules}))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    modules = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert "torch" in modules and "tensorflow" not in modules


# ----------------------------------------------------------------------------- allreduce

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64]



def allreduce_is_exact_for_every_dtype_shape_and_op():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    for dtype in DTYPES:
        for shape in [(), (5,), (3, 4), (2, 3, 4)]:
            x = torch.full(shape, r + 1, dtype=dtype)
            total = n * (n + 1) // 2
            assert torch.equal(hvd.allreduce(x, op=hvd.Sum), torch.full(shape, total, dtype=dtype)), (dtype, shape)
            assert torch.equal(hvd.allreduce(x, op=hvd.Min), torch.full(shape, 1, dtype=dtype))
            assert torch.equal(hvd.allreduce(x, op=hvd.Max), torch.full(shape, n, dtype=dtype))
            if dtype.is_floating_point:
                averaged = hvd.allreduce(x * 2)  # the default op is Average
                assert torch.equal(averaged, torch.full(shape, n + 1, dtype=dtype)), (dtype, shape)
    hvd.shutdown()


def product_and_scale_factors_are_exact():
    hvd.init()
    n = hvd.size()
    x = torch.full((4,), 2.0, dtype=torch.float64)
    assert torch.equal(hvd.allreduce(x, op=hvd.Product), torch.full((4,), 2.0 ** n, dtype=torch.float64))
    scaled = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    assert torch.equal(scaled, torch.full((4,), 3.0 * n, dtype=torch.float64))
    hvd.shutdown()


def allreduce_leaves_its_input_and_allreduce_async__reduces_in_place():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    y = torch.full((6,), float(r), dtype=torch.float32)
    hvd.allreduce(y, op=hvd.Sum)
    assert torch.equal(y, torch.full((6,), float(r)))
    handle = hvd.allreduce_async_(y, op=hvd.Sum, name="in_place")
    out = hvd.synchronize(handle)
    assert out is y and torch.equal(y, torch.full((6,), float(n * (n - 1) // 2)))
    hvd.shutdown()


def an_async_allreduce_is_polled_until_done():
    hvd.init()
    handle = hvd.allreduce_async(torch.ones(3), name="polled")
    while not hvd.poll(handle):
        pass
    assert torch.equal(hvd.synchronize(handle), torch.ones(3))
    hvd.shutdown()


def a_non_contiguous_input_is_reduced_out_of_place_and_refused_in_place():
    hvd.init()
    t = torch.arange(12.0).reshape(3, 4).t()
    assert torch.equal(hvd.allreduce(t, op=hvd.Sum), t * hvd.size())
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce_(t)
    hvd.shutdown()


def the_deprecated_average_argument_warns_and_may_not_be_given_with_op():
    hvd.init()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(hvd.allreduce(torch.ones(2), average=False), torch.full((2,), float(hvd.size())))
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)
    hvd.shutdown()


def fp16_compression_keeps_the_dtype_and_exactly_representable_values():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    compressed = hvd.allreduce(torch.full((5,), 0.25 * (r + 1)), op=hvd.Sum, compression=hvd.Compression.fp16)
    assert compressed.dtype == torch.float32 and torch.equal(compressed, torch.full((5,), 0.25 * n * (n + 1) / 2))
    hvd.shutdown()


def grouped_allreduce_reduces_members_of_different_dtypes():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    grouped = hvd.grouped_allreduce([torch.ones(2) * r, torch.ones(3, dtype=torch.int64) * r], op=hvd.Sum)
    assert torch.equal(grouped[0], torch.ones(2) * (n * (n - 1) // 2))
    assert torch.equal(grouped[1], torch.ones(3, dtype=torch.int64) * (n * (n - 1) // 2))
    hvd.shutdown()


# ----------------------------------------------------------------------------- the other collectives


def allgather_concatenates_rows_that_differ_by_rank():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    gathered = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int32))
    expected = torch.cat([torch.full((k + 1, 2), k, dtype=torch.int32) for k in range(n)])
    assert torch.equal(gathered, expected)
    hvd.shutdown()


def broadcast_leaves_its_input_and_broadcast__overwrites_it():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    for root in range(n):
        value = torch.full((3, 2), float(r))
        assert torch.equal(hvd.broadcast(value, root), torch.full((3, 2), float(root)))
        assert torch.equal(value, torch.full((3, 2), float(r))), "broadcast modified its input"
        hvd.broadcast_(value, root)
        assert torch.equal(value, torch.full((3, 2), float(root)))
    hvd.shutdown()


def alltoall_with_uneven_and_empty_splits_sends_each_rank_its_rows():
    """Rank r sends k+r rows to rank k (some are empty)."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    splits = [k + r for k in range(n)] if r else [0] * (n - 1) + [1]
    rows = torch.arange(sum(splits), dtype=torch.float32).unsqueeze(1) + 100 * r
    received, received_splits = hvd.alltoall(rows, splits=torch.tensor(splits, dtype=torch.int32))
    expected_splits = [(r + k if k else (1 if r == n - 1 else 0)) for k in range(n)]
    assert received_splits.tolist() == expected_splits
    parts = []
    for k in range(n):
        their_splits = [j + k for j in range(n)] if k else [0] * (n - 1) + [1]
        start = sum(their_splits[:r])
        parts.append(torch.arange(start, start + their_splits[r], dtype=torch.float32).unsqueeze(1) + 100 * k)
    assert torch.equal(received, torch.cat(parts))
    hvd.shutdown()


def reducescatter_gives_the_first_rank_the_extra_row():
    """2n+1 rows."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    x = torch.arange(2 * n + 1, dtype=torch.float64).unsqueeze(1) * (r + 1)
    mine = hvd.reducescatter(x, op=hvd.Sum)
    start = 2 * r + min(r, 1)
    rows_here = 3 if r == 0 else 2
    assert torch.equal(mine, torch.arange(start, start + rows_here, dtype=torch.float64).unsqueeze(1) * n * (n + 1) / 2)
    hvd.shutdown()


def object_collectives_carry_python_objects():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    assert hvd.broadcast_object({"from": r}, root_rank=n - 1) == {"from": n - 1}
    assert hvd.allgather_object(("rank", r)) == [("rank", k) for k in range(n)]
    hvd.shutdown()


def alltoall_returns_the_tensor_alone_without_splits_and_with_its_splits_otherwise():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    rows = torch.arange(2 * n, dtype=torch.float32).unsqueeze(1) + 100 * r
    expected = torch.cat([torch.tensor([[2.0 * r], [2.0 * r + 1]]) + 100 * k for k in range(n)])
    received = hvd.alltoall(rows)
    assert torch.is_tensor(received) and torch.equal(received, expected)
    received, received_splits = hvd.alltoall(rows, splits=[2] * n)
    assert torch.equal(received, expected)
    assert received_splits.dtype == torch.int32 and received_splits.tolist() == [2] * n
    # A handle's synchronize() gives both, with splits or without.
    for splits in (None, torch.full((n,), 2, dtype=torch.int32)):
        received, received_splits = hvd.synchronize(hvd.alltoall_async(rows, splits=splits))
        assert torch.equal(received, expected) and received_splits.tolist() == [2] * n
    hvd.shutdown()


def float_alltoall_splits_are_refused_on_every_rank_before_anything_is_sent():
    """So the next collective still pairs up (a cast would have sent other row counts than the
    peers expect)."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    for splits, described in [(torch.ones(n), "a tensor of torch.float32"), ([1.0] * n, "float64 values"),
                              ([0.5] * (n - 1) + [n - 0.5 * (n - 1)], "float64 values")]:
        with pytest.raises(ValueError, match=f"alltoall: splits must be integers .*got {described}"):
            hvd.alltoall(torch.ones(n, 1), splits=splits)
    rows = torch.arange(2 * n, dtype=torch.float32).unsqueeze(1) + 100 * r
    expected = torch.cat([torch.tensor([[2.0 * r], [2.0 * r + 1]]) + 100 * k for k in range(n)])
    received, received_splits = hvd.alltoall(rows, splits=torch.full((n,), 2, dtype=torch.int64))
    assert torch.equal(received, expected) and received_splits.tolist() == [2] * n
    assert torch.equal(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(n)))
    hvd.shutdown()


def sparse_allreduce_async_equals_the_dense_allreduce():
    hvd.init()
    generator = torch.Generator().manual_seed(hvd.rank())
    for op in (hvd.Average, hvd.Sum):
        dense = torch.rand(7, 5, generator=generator, dtype=torch.float64)
        dense[dense < 0.7] = 0
        handle = hvd.sparse_allreduce_async(dense.to_sparse(), name=f"sparse.{op}", op=op)
        # Horovod's handle is a function to call; ours also works with synchronize().
        result = handle() if op == hvd.Average else hvd.synchronize(handle)
        assert result.is_sparse
        assert torch.allclose(result.to_dense(), hvd.allreduce(dense, op=op), rtol=0, atol=1e-15)
    hvd.shutdown()


# ----------------------------------------------------------------------------- grouped allgather, reducescatter


def grouped_allgather_gives_each_member_the_result_of_its_single_form():
    """The members differ in rows, dtype and shape."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    a = torch.full((r + 1, 2), r, dtype=torch.int32)
    b = torch.arange(2 * (n - r), dtype=torch.float64).reshape(n - r, 2, 1) + r
    ga, gb = hvd.grouped_allgather([a, b], name="grouped.gather")
    assert torch.equal(ga, torch.cat([torch.full((k + 1, 2), k, dtype=torch.int32) for k in range(n)]))
    assert torch.equal(gb, torch.cat([torch.arange(2 * (n - k), dtype=torch.float64).reshape(n - k, 2, 1) + k
                                      for k in range(n)]))
    handle = hvd.grouped_allgather_async([a], name="grouped.gather.async")
    assert torch.equal(hvd.synchronize(handle)[0], ga)
    hvd.shutdown()


def grouped_reducescatter_gives_each_member_the_result_of_its_single_form():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    x = torch.arange(2 * n + 1, dtype=torch.float64).unsqueeze(1) * (r + 1)
    y = torch.ones(n, 3, dtype=torch.float32) * (r + 1)
    sx, sy = hvd.grouped_reducescatter([x, y], op=hvd.Sum, postscale_factor=2.0)
    start, rows_here = 2 * r + min(r, 1), 3 if r == 0 else 2
    total = n * (n + 1) / 2
    assert torch.equal(sx, torch.arange(start, start + rows_here, dtype=torch.float64).unsqueeze(1) * total * 2)
    assert torch.equal(sy, torch.full((1, 3), total * 2, dtype=torch.float32))
    averaged = hvd.synchronize(hvd.grouped_reducescatter_async([y], name="grouped.rs.async"))[0]
    assert torch.allclose(averaged, torch.full((1, 3), total / n))
    hvd.shutdown()


# ----------------------------------------------------------------------------- gradients


def allreduces_gradient_is_the_reduction_of_the_incoming_gradients():
    hvd.init()
    x = torch.ones(4, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).backward(torch.ones(4))
    assert torch.equal(x.grad, torch.full((4,), float(hvd.size())))
    x = torch.ones(4, requires_grad=True)
    hvd.allreduce(x).backward(torch.ones(4))
    assert torch.equal(x.grad, torch.ones(4))
    hvd.shutdown()


def allgathers_gradient_is_the_average_of_the_gradients_of_this_ranks_rows():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(r + 1, 3, requires_grad=True)
    gathered = hvd.allgather(x)
    weights = torch.cat([torch.full((k + 1, 3), float(k)) for k in range(n)])
    gathered.backward(weights)
    assert torch.equal(x.grad, torch.full((r + 1, 3), float(r)))
    hvd.shutdown()


def broadcasts_gradient_is_the_average_on_the_root_and_zero_elsewhere():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    x = torch.ones(2, requires_grad=True)
    hvd.broadcast(x, root).backward(torch.ones(2))
    assert torch.equal(x.grad, torch.ones(2) * (1.0 if r == root else 0.0))
    hvd.shutdown()


def reducescatters_gradient_is_the_gathered_gradients_times_the_size_for_sum():
    """As Horovod 0.28 defines it."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(2 * n, 1, requires_grad=True)
    hvd.reducescatter(x, op=hvd.Sum).backward(torch.full((2, 1), float(r)))
    assert torch.equal(x.grad, torch.cat([torch.full((2, 1), float(k * n)) for k in range(n)]))
    hvd.shutdown()


def reducescatters_gradient_takes_its_scale_factors_single_and_grouped():
    """Horovod 0.28: the gathered output gradients, times prescale * postscale, times the size
    for Sum only."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    cases = [(hvd.Sum, 1.0, 1.0, n), (hvd.Average, 1.0, 1.0, 1), (hvd.Sum, 0.5, 3.0, 1.5 * n),
             (hvd.Average, 0.5, 3.0, 1.5)]
    for op, prescale, postscale, factor in cases:
        x = torch.ones(2 * n, 1, dtype=torch.float64, requires_grad=True)
        out = hvd.reducescatter(x, op=op, prescale_factor=prescale, postscale_factor=postscale)
        out.backward(torch.full((2, 1), float(r + 1), dtype=torch.float64))
        expected = torch.cat([torch.full((2, 1), (k + 1) * factor, dtype=torch.float64) for k in range(n)])
        assert torch.equal(x.grad, expected), (op, prescale, postscale, x.grad)

        xs = [torch.ones(n, 2, requires_grad=True), torch.ones(2 * n, dtype=torch.float64, requires_grad=True)]
        outs = hvd.grouped_reducescatter(xs, op=op, prescale_factor=prescale, postscale_factor=postscale)
        torch.autograd.backward(outs, [torch.full((1, 2), float(r + 1)),
                                       torch.full((2,), float(r + 1), dtype=torch.float64)])
        assert torch.equal(xs[0].grad, torch.cat([torch.full((1, 2), (k + 1) * factor) for k in range(n)]))
        assert torch.equal(xs[1].grad, torch.cat([torch.full((2,), (k + 1) * factor, dtype=torch.float64)
                                                  for k in range(n)]))
    hvd.shutdown()


def alltoalls_gradients_go_back_to_where_the_rows_came_from():
    """Without splits too."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(n, 1, requires_grad=True)
    received = hvd.alltoall(x)
    received.backward(torch.arange(n, dtype=torch.float32).unsqueeze(1) + 10 * r)
    assert torch.equal(x.grad, torch.tensor([[float(r + 10 * k)] for k in range(n)]))
    hvd.shutdown()


def grouped_gradients_are_those_of_the_single_forms_member_by_member():
    """Allgather's; reducescatter's with Average: the gathered output gradients, as Horovod 0.28
    defines it."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    xa = torch.ones(r + 1, 3, requires_grad=True)
    xb = torch.ones(2, requires_grad=True)
    out_a, out_b = hvd.grouped_allgather([xa, xb])
    torch.autograd.backward([out_a, out_b], [torch.cat([torch.full((k + 1, 3), float(k)) for k in range(n)]),
                                             torch.arange(2.0 * n)])
    assert torch.equal(xa.grad, torch.full((r + 1, 3), float(r)))
    assert torch.equal(xb.grad, torch.tensor([2.0 * r, 2.0 * r + 1]))
    xs = [torch.ones(2 * n, 1, requires_grad=True), torch.ones(n, requires_grad=True)]
    outs = hvd.grouped_reducescatter(xs, op=hvd.Average)
    torch.autograd.backward(outs, [torch.full((2, 1), float(r)), torch.full((1,), float(r))])
    assert torch.equal(xs[0].grad, torch.cat([torch.full((2, 1), float(k)) for k in range(n)]))
    assert torch.equal(xs[1].grad, torch.tensor([float(k) for k in range(n)]))
    hvd.shutdown()


# ----------------------------------------------------------------------------- scale factors per dtype


def _compute_dtype(dtype):
    """Where Horovod scales on the CPU: integers in float64, 16-bit floats in float32."""
    if not dtype.is_floating_point:
        return torch.float64
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _scaled(tensor, factor):
    """`tensor` times `factor` as Horovod computes it, in the tensor's dtype."""
    compute = _compute_dtype(tensor.dtype)
    return (tensor.to(compute) * torch.tensor(factor, dtype=torch.float64).to(compute)).to(tensor.dtype)


def _expected_reduction(tensor, size, op, prescale, postscale):
    """Every rank holds `tensor`: each scales it by `prescale`, the sum is exact then rounded
    once to the dtype (the ranks add equal values), then it is scaled by `postscale`, with
    Average's 1/size folded in as Horovod folds it."""
    total = (_scaled(tensor, prescale).to(torch.float64) * size).to(tensor.dtype)
    return _scaled(total, postscale / size if op == "average" else postscale)


def _scale_cases(n):
    """(dtype, dim, op, prescale, postscale, input) for every reducible dtype; Horovod's tests
    draw inputs in [-100, 100); here narrower where 8-bit sums must not overflow."""
    generator = torch.Generator().manual_seed(1234)
    factor = float(np.random.default_rng(1234).uniform())
    for dtype in DTYPES:
        low, high = {torch.uint8: (0, 80), torch.int8: (-40, 40)}.get(dtype, (-100, 100))
        for dim in (1, 2, 3):
            tensor = torch.randint(low, high, (2 * n,) * dim, generator=generator).to(dtype)
            ops = ["sum", "average"] if dtype.is_floating_point else ["sum"]
            for op in ops:
                for prescale, postscale in ((factor, 1.0), (1.0, factor), (factor, 1.0 / factor)):
                    yield dtype, dim, op, prescale, postscale, tensor


def scale_factors_give_horovods_results_for_every_dtype():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    ops = {"sum": hvd.Sum, "average": hvd.Average}
    wrong = []
    for dtype, dim, op, prescale, postscale, tensor in _scale_cases(n):
        expected = _expected_reduction(tensor, n, op, prescale, postscale)
        mine = expected[2 * r:2 * r + 2]
        kwargs = dict(op=ops[op], prescale_factor=prescale, postscale_factor=postscale)
        results = {
            "allreduce": (hvd.allreduce(tensor, **kwargs), expected),
            "grouped_allreduce": (hvd.grouped_allreduce([tensor, tensor[:1]], **kwargs)[1], expected[:1]),
            "reducescatter": (hvd.reducescatter(tensor, **kwargs), mine),
            "grouped_reducescatter": (hvd.grouped_reducescatter([tensor[:n], tensor], **kwargs)[1], mine),
        }
        # Horovod's tolerance at up to 3 ranks is none: the results must be exact.
        for what, (got, want) in results.items():
            if got.dtype != dtype or not torch.equal(got, want):
                wrong.append(f"{what} {str(dtype).replace('torch.', '')} {dim}-D {op} "
                             f"prescale={prescale:.4f} postscale={postscale:.4f}")
    assert not wrong, f"rank {r}: {len(wrong)} results differ from Horovod's:\n" + "\n".join(wrong)
    hvd.shutdown()


# ----------------------------------------------------------------------------- join and errors


def ranks_that_joined_contribute_zeros_and_join_returns_the_last_rank():
    """Rank 0 runs out of data first; the others keep averaging with zeros from it."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    for step in range(r):
        averaged = hvd.allreduce(torch.full((3,), 1.0), name=f"join.step.{step}")
        contributors = sum(1 for k in range(n) if k > step)
        assert torch.equal(averaged, torch.full((3,), contributors / n)), (step, averaged)
    assert hvd.join() == n - 1
    hvd.barrier()
    hvd.shutdown()


def ranks_that_disagree_about_a_shape_all_fail_and_the_engine_goes_on():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    with pytest.raises(hvd.HorovodInternalError, match="Mismatched shape.*rank"):
        hvd.allreduce(torch.ones(r + 1), name="disagreeing.shape")
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))
    hvd.shutdown()


COLLECTIVES = [allreduce_is_exact_for_every_dtype_shape_and_op, product_and_scale_factors_are_exact,
               allreduce_leaves_its_input_and_allreduce_async__reduces_in_place,
               an_async_allreduce_is_polled_until_done,
               a_non_contiguous_input_is_reduced_out_of_place_and_refused_in_place,
               the_deprecated_average_argument_warns_and_may_not_be_given_with_op,
               fp16_compression_keeps_the_dtype_and_exactly_representable_values,
               grouped_allreduce_reduces_members_of_different_dtypes,
               allgather_concatenates_rows_that_differ_by_rank, broadcast_leaves_its_input_and_broadcast__overwrites_it,
               alltoall_with_uneven_and_empty_splits_sends_each_rank_its_rows,
               reducescatter_gives_the_first_rank_the_extra_row, object_collectives_carry_python_objects,
               alltoall_returns_the_tensor_alone_without_splits_and_with_its_splits_otherwise,
               float_alltoall_splits_are_refused_on_every_rank_before_anything_is_sent,
               sparse_allreduce_async_equals_the_dense_allreduce,
               grouped_allgather_gives_each_member_the_result_of_its_single_form,
               grouped_reducescatter_gives_each_member_the_result_of_its_single_form,
               allreduces_gradient_is_the_reduction_of_the_incoming_gradients,
               allgathers_gradient_is_the_average_of_the_gradients_of_this_ranks_rows,
               broadcasts_gradient_is_the_average_on_the_root_and_zero_elsewhere,
               reducescatters_gradient_is_the_gathered_gradients_times_the_size_for_sum,
               reducescatters_gradient_takes_its_scale_factors_single_and_grouped,
               alltoalls_gradients_go_back_to_where_the_rows_came_from,
               grouped_gradients_are_those_of_the_single_forms_member_by_member,
               scale_factors_give_horovods_results_for_every_dtype,
               ranks_that_joined_contribute_zeros_and_join_returns_the_last_rank,
               ranks_that_disagree_about_a_shape_all_fail_and_the_engine_goes_on]


# ----------------------------------------------------------------------------- broadcast_optimizer_state


def _model_with_an_unused_layer_and_an_embedding():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(3, 2), "unused": torch.nn.Linear(2, 2),
                                 "embedding": torch.nn.Embedding(5, 3, sparse=True)})
    model["unused"].bias.requires_grad_(False)
    return model


def _dense_parameters(model):
    return [p for name in ("used", "unused") for p in model[name].parameters()]


def a_distributed_optimizers_zero_gradients_are_its_bucket_views_and_sparse_for_embeddings():
    """A fresh DistributedOptimizer; training goes on from there, the embedding's gradients
    reduced sparse."""
    hvd.init()
    model = _model_with_an_unused_layer_and_an_embedding()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0, model=model)
    for p in _dense_parameters(model):
        if p.requires_grad:
            assert not p.grad.is_sparse and torch.count_nonzero(p.grad) == 0
            assert p.grad.data_ptr() == optimizer._buckets.view[p].data_ptr()
            torch.empty_like(p.grad)  # what Horovod scripts do with it
        else:
            assert p.grad is None
    embedding_grad = model["embedding"].weight.grad
    assert embedding_grad.is_sparse and torch.count_nonzero(embedding_grad.to_dense()) == 0
    out = model["used"](model["embedding"](torch.tensor([hvd.rank()])))
    out.sum().backward()
    optimizer.step()
    assert model["embedding"].weight.grad.is_sparse
    hvd.shutdown()


def a_plain_optimizer_with_state_to_initialize_gets_zero_gradients_and_no_step():
    hvd.init()
    dense_params = _dense_parameters(_model_with_an_unused_layer_and_an_embedding())
    weights = [p.detach().clone() for p in dense_params]
    adam = torch.optim.Adam([p for p in dense_params if p.requires_grad], lr=0.1, weight_decay=0.1)
    hvd.broadcast_optimizer_state(adam, root_rank=0)
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in dense_params if p.requires_grad)
    assert all(torch.equal(p.detach(), w) for p, w in zip(dense_params, weights))
    hvd.shutdown()


def sparse_adam_gets_sparse_zero_gradients():
    hvd.init()
    model = _model_with_an_unused_layer_and_an_embedding()
    sparse_adam = torch.optim.SparseAdam(list(model["embedding"].parameters()))
    hvd.broadcast_optimizer_state(sparse_adam, root_rank=0)
    assert model["embedding"].weight.grad.is_sparse
    hvd.shutdown()


OPTIMIZER_STATE = [a_distributed_optimizers_zero_gradients_are_its_bucket_views_and_sparse_for_embeddings,
                   a_plain_optimizer_with_state_to_initialize_gets_zero_gradients_and_no_step,
                   sparse_adam_gets_sparse_zero_gradients]


# ----------------------------------------------------------------------------- SyncBatchNorm


def sync_batch_norm_matches_batch_norm_over_all_ranks():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4 * n, 3, 5, 5, generator=generator, dtype=torch.float64) * 3 + 1
    upstream = torch.randn(4 * n, 3, 5, 5, generator=generator, dtype=torch.float64)

    reference = torch.nn.BatchNorm2d(3).double()
    reference.weight.data.uniform_(0.5, 1.5, generator=generator)
    reference.bias.data.uniform_(-1, 1, generator=generator)
    sync = hvd.SyncBatchNorm(3).double()
    sync.load_state_dict(reference.state_dict())

    whole = x.clone().requires_grad_()
    (reference(whole) * upstream).sum().backward()
    mine = x[4 * r:4 * (r + 1)].clone().requires_grad_()
    out = sync(mine)
    (out * upstream[4 * r:4 * (r + 1)]).sum().backward()

    expected_out = torch.nn.functional.batch_norm(x, None, None, reference.weight, reference.bias, True, 0.0, 1e-5)
    assert torch.allclose(out, expected_out[4 * r:4 * (r + 1)], atol=1e-12)
    assert torch.allclose(sync.running_mean, reference.running_mean, atol=1e-12)
    assert torch.allclose(sync.running_var, reference.running_var, atol=1e-12)
    assert torch.allclose(mine.grad, whole.grad[4 * r:4 * (r + 1)], atol=1e-10)
    # Parameter gradients are this rank's share; their sum over ranks is the whole batch's.
    assert torch.allclose(hvd.allreduce(sync.weight.grad, op=hvd.Sum), reference.weight.grad, atol=1e-10)
    assert torch.allclose(hvd.allreduce(sync.bias.grad, op=hvd.Sum), reference.bias.grad, atol=1e-10)
    # In evaluation it normalizes with the running statistics, locally.
    sync.eval()
    reference.eval()
    assert torch.allclose(sync(mine.detach()), reference(mine.detach()), atol=1e-12)
    hvd.shutdown()


# ----------------------------------------------------------------------------- elastic

# Divides by 2 and 3; the remainder after a record of 8 samples (8 = 4 per rank on 2 ranks) divides
# by neither, so that the shares are filled up.
ELASTIC_DATASET = list(range(24))


def _shares(sampler):
    """Every rank's share of `sampler`'s epoch, in rank order."""
    return hvd.allgather_object(list(sampler))


def _epoch_order(sampler):
    """`sampler`'s epoch in its order, put together from the ranks' shares, which deal it out
    (rank r has positions r, r + n, ...): one gather."""
    shares = _shares(sampler)
    return [shares[i % len(shares)][i // len(shares)] for i in range(sum(map(len, shares)))]


def an_elastic_sampler_shares_an_epoch_among_the_ranks_in_the_order_of_its_seed_and_epoch():
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(ELASTIC_DATASET, seed=3)
    shares = _shares(sampler)
    assert sorted(sum(shares, [])) == ELASTIC_DATASET and len(sampler) == len(ELASTIC_DATASET) // hvd.size()
    assert _epoch_order(sampler) != ELASTIC_DATASET
    assert _shares(hvd.elastic.ElasticSampler(ELASTIC_DATASET, seed=3)) == shares
    sampler.set_epoch(1)
    assert sorted(sum(_shares(sampler), [])) == ELASTIC_DATASET and _shares(sampler) != shares
    unshuffled = hvd.elastic.ElasticSampler(ELASTIC_DATASET, shuffle=False)
    assert list(unshuffled) == ELASTIC_DATASET[hvd.rank()::hvd.size()]
    hvd.shutdown()


def an_elastic_sampler_given_a_record_shares_only_the_rest_of_the_epoch():
    hvd.init()
    n = hvd.size()
    whole = hvd.elastic.ElasticSampler(ELASTIC_DATASET, seed=5)
    whole.set_epoch(2)
    order = _epoch_order(whole)
    restarted = hvd.elastic.ElasticSampler(ELASTIC_DATASET, seed=5)
    # as a job started again on n ranks gets it from a commit made on another number of ranks
    restarted.load_state_dict({"epoch": 2, "processed_num": 8})
    shares = _shares(restarted)
    rest = order[8:]
    assert set(sum(shares, [])) == set(rest) and all(len(share) == -(-len(rest) // n) for share in shares)
    assert [share[0] for share in shares] == rest[:n]  # the rest of the epoch's order, dealt out
    restarted.set_epoch(3)
    assert sorted(sum(_shares(restarted), [])) == ELASTIC_DATASET
    hvd.shutdown()


def record_batch_counts_every_ranks_batch():
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(ELASTIC_DATASET)
    sampler.record_batch(0, 2)
    sampler.record_batch(1, 2)
    assert sampler.processed_num == 4 * hvd.size()
    hvd.shutdown()


def a_torch_states_sync_gives_every_model_and_sampler_rank_0s_state():
    hvd.init()
    torch.manual_seed(hvd.rank())
    generator, discriminator = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
    sampler = hvd.elastic.ElasticSampler(ELASTIC_DATASET)
    sampler.record_batch(0, 1 + hvd.rank())
    state = hvd.elastic.TorchState(generator=generator, discriminator=discriminator, train_sampler=sampler)
    state.sync()
    for model in (generator, discriminator):
        for weights in hvd.allgather_object({name: value.tolist() for name, value in model.state_dict().items()}):
            assert weights == {name: value.tolist() for name, value in model.state_dict().items()}
    assert sampler.processed_num == hvd.size() and len(sampler) == -(-(len(ELASTIC_DATASET) - hvd.size()) // hvd.size())
    hvd.shutdown()


def a_samplers_record_is_committed_and_restored_in_place():
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(ELASTIC_DATASET)
    state = hvd.elastic.TorchState(train_sampler=sampler, epoch=0)
    sampler.record_batch(0, 2)
    state.commit()
    sampler.record_batch(1, 2)
    state.restore()
    assert state.train_sampler is sampler and sampler.processed_num == 2 * hvd.size()
    recorded = _epoch_order(hvd.elastic.ElasticSampler(ELASTIC_DATASET))[:2 * hvd.size()]
    assert set(sum(_shares(sampler), [])) == set(ELASTIC_DATASET) - set(recorded)
    hvd.shutdown()


ELASTIC = [an_elastic_sampler_shares_an_epoch_among_the_ranks_in_the_order_of_its_seed_and_epoch,
           an_elastic_sampler_given_a_record_shares_only_the_rest_of_the_epoch, record_batch_counts_every_ranks_batch,
           a_torch_states_sync_gives_every_model_and_sampler_rank_0s_state,
           a_samplers_record_is_committed_and_restored_in_place]


# ----------------------------------------------------------------------------- the jobs

JOBS = {2: COLLECTIVES + OPTIMIZER_STATE + ELASTIC,
        3: COLLECTIVES + OPTIMIZER_STATE + ELASTIC + [sync_batch_norm_matches_batch_norm_over_all_ranks]}


def job(ranks, num_proc):
    return ranks.run(num_proc, JOBS[num_proc], timeout=480)


@pytest.mark.parametrize("num_proc", [2, 3])
@pytest.mark.parametrize("check", COLLECTIVES, ids=lambda check: check.__name__)
def test_collectives_on_real_ranks(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)


@pytest.mark.parametrize("num_proc", [2, 3])
@pytest.mark.parametrize("check", OPTIMIZER_STATE, ids=lambda check: check.__name__)
def test_broadcast_optimizer_state_leaves_horovods_zero_gradients(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)


def test_sync_batch_norm_matches_batch_norm_over_all_ranks(ranks):
    job(ranks, 3).assert_passed(sync_batch_norm_matches_batch_norm_over_all_ranks)


@pytest.mark.parametrize("num_proc", [2, 3])
@pytest.mark.parametrize("check", ELASTIC, ids=lambda check: check.__name__)
def test_elastic_samplers_and_states_on_real_ranks(ranks, check, num_proc):
    job(ranks, num_proc).assert_passed(check)
