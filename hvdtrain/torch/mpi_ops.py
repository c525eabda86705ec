"""Collectives on torch tensors, with horovod.torch's names, signatures and semantics.

Tensors cross to the core without copies: CPU tensors as NumPy views of their memory, CUDA
tensors as CuPy views (the `gpu` extra), submitted with the caller's current CUDA stream, which
synchronize() makes wait for the result: no host synchronisation. Outputs whose size only the
collective tells (allgather, alltoall, reducescatter) are allocated by torch on that stream. The
synchronous forms are autograd functions, so gradients flow through allreduce, allgather,
broadcast, alltoall and reducescatter as in Horovod.
"""

import itertools

import numpy as np
import torch

from hvdtrain import core
from hvdtrain.core import global_process_set
from hvdtrain.core.horovod_api import Average, Sum, handle_average_backwards_compatibility

from .compression import Compression


# ----------------------------------------------------------------------------- tensors <-> arrays


def _array(tensor):
    """A NumPy view of a CPU tensor's memory, or a CuPy view of a CUDA tensor's."""
    if tensor.device.type == "cuda":
        return _device_array(tensor)
    if tensor.device.type != "cpu":
        raise NotImplementedError(f"hvdtrain.torch: tensors on {tensor.device} are not supported; use cpu or cuda")
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _device_array(tensor):
    """A CuPy array over a CUDA tensor's memory, which it keeps alive."""
    cp = core.cuda.cupy()
    memory = cp.cuda.UnownedMemory(tensor.data_ptr(), tensor.numel() * tensor.element_size(), tensor,
                                   tensor.device.index)
    return cp.ndarray(tuple(tensor.shape), _numpy_dtype(tensor.dtype), cp.cuda.MemoryPointer(memory, 0))


_NUMPY_DTYPES = {}


def _numpy_dtype(torch_dtype):
    found = _NUMPY_DTYPES.get(torch_dtype)
    if found is None:
        if torch_dtype == torch.bfloat16:
            import ml_dtypes

            found = np.dtype(ml_dtypes.bfloat16)
        else:
            found = torch.empty(0, dtype=torch_dtype).numpy().dtype
        _NUMPY_DTYPES[torch_dtype] = found
    return found


def _torch_dtype(numpy_dtype):
    for torch_dtype, known in _NUMPY_DTYPES.items():
        if known == numpy_dtype:
            return torch_dtype
    raise TypeError(f"hvdtrain.torch: no torch dtype for {numpy_dtype}")


def _tensor(array):
    """The torch tensor over a NumPy array's memory."""
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _cuda_build():
    """torch's CUDA and NCCL versions where it can use a GPU, which init() checks against CuPy's:
    one process must not load two CUDA runtimes or two NCCL libraries."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        return None
    try:
        nccl = tuple(torch.cuda.nccl.version())
    except (AttributeError, RuntimeError):  # a build without NCCL
        nccl = None
    return torch.version.cuda, nccl


core.cuda.declare_framework("torch", _cuda_build)


def _stream(tensor):
    """What the core needs of the caller's stream: the current CUDA stream of the tensor's device."""
    return _current_stream(tensor.device) if tensor.is_cuda else None


def _current_stream(device):
    return torch.cuda.current_stream(device).cuda_stream


class _TorchOutput:
    """Makes the output of a device collective with torch, on the stream that was current when
    it was submitted (so torch's allocator orders reuse of that memory on it), and keeps it:
    the result is the tensor, not its CuPy view."""

    __slots__ = ("device", "stream", "tensor")

    def __init__(self, like):
        self.device = like.device
        self.stream = torch.cuda.current_stream(like.device)
        self.tensor = None

    def __call__(self, shape, dtype):
        with torch.cuda.stream(self.stream):
            self.tensor = torch.empty(shape, dtype=_torch_dtype(dtype), device=self.device)
        return _device_array(self.tensor)


def _allocator(tensor):
    return _TorchOutput(tensor) if tensor.is_cuda else None


def _result(result, allocated):
    """A core result as a torch tensor: the one torch allocated for a device result."""
    return _tensor(result) if allocated is None else allocated.tensor


def _output_array(output, in_place):
    # The core recognizes an in-place operation by getting no separate output.
    return None if in_place else _array(output)


def _source(tensor, in_place):
    if tensor.is_contiguous():
        return tensor
    if in_place:
        raise ValueError("Tensor is required to be contiguous for an in-place collective.")
    return tensor.contiguous()


# ----------------------------------------------------------------------------- handles

# Horovod hands out integer handles; each maps to the core's handles and a function that
# turns their results into what synchronize() returns.
_handle_map = {}
_handle_counter = itertools.count()


def _register(core_handles, finish):
    handle = next(_handle_counter)
    _handle_map[handle] = (core_handles, finish)
    return handle


def poll(handle):
    """True once the asynchronous operation of `handle` has finished."""
    core_handles, _ = _handle_map[handle]
    return all(h.poll() for h in core_handles)


def synchronize(handle):
    """Wait for the operation of `handle` and return its result; a CUDA result is ready for the
    current stream (which waits for it on the device: the host does not)."""
    if handle not in _handle_map:
        return None
    core_handles, finish = _handle_map.pop(handle)
    return finish([h.wait(stream=_current_stream) for h in core_handles])


# ----------------------------------------------------------------------------- allreduce


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set, bucket=None,
                     array=None):
    """`array`: a NumPy view of `tensor` that the caller keeps from step to step; the core
    recognizes the same array under the same name and skips validating it again."""
    in_place = output is tensor
    if array is None:
        array = _array(_source(tensor, in_place))
    handle = core.allreduce_async(array, name=name, op=op, prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor, output=_output_array(output, in_place),
                                  bucket=bucket, process_set=process_set, stream=_stream(tensor))
    return _register([handle], lambda _: output)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Start reducing `tensor` over the ranks (of `process_set`) into a new tensor; returns a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format), name, op,
                            prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """Start reducing `tensor` over the ranks (of `process_set`) in place; returns a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    op = handle_average_backwards_compatibility(op, average)
    return synchronize(_allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set))


class HorovodAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.prescale_factor, ctx.postscale_factor = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        return synchronize(allreduce_async(tensor, name=name, op=op, prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.prescale_factor,
                         postscale_factor=ctx.postscale_factor, process_set=ctx.process_set)
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Reduce `tensor` over the ranks (of `process_set`; Average by default); differentiable."""
    op = handle_average_backwards_compatibility(op, average)
    compressed, context = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, context)


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor, process_set):
    sources = [_source(t, o is t) for t, o in zip(tensors, outputs)]
    handles = core.grouped_allreduce_async([_array(s) for s in sources], name=name, op=op,
                                           prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                           outputs=[_output_array(o, o is t) for t, o in zip(tensors, outputs)],
                                           process_set=process_set, stream=_group_stream(tensors))
    return _register(handles, lambda _: list(outputs))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    op = handle_average_backwards_compatibility(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    op = handle_average_backwards_compatibility(op, average)
    return synchronize(_grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor,
                                                process_set))


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.prescale_factor, ctx.postscale_factor = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), name=name, op=op,
                                                         prescale_factor=prescale_factor,
                                                         postscale_factor=postscale_factor,
                                                         process_set=process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce(list(grad_outputs), op=ctx.op, prescale_factor=ctx.prescale_factor,
                                  postscale_factor=ctx.postscale_factor, process_set=ctx.process_set)
        return (None, None, None, None, None, *grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduce a list of tensors together (negotiated and fused as one group); differentiable."""
    op = handle_average_backwards_compatibility(op, average)
    compressed = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                            *[c for c, _ in compressed])
    return [compression.decompress(r, context) for r, (_, context) in zip(reduced, compressed)]


def _group_stream(tensors):
    return _stream(tensors[0]) if tensors else None


# ----------------------------------------------------------------------------- sparse allreduce


class _CallableHandle(int):
    """Horovod's sparse_allreduce_async returns a function that gives the result; this handle is
    that function and an integer handle for poll() and synchronize() at once."""

    def __call__(self):
        return synchronize(self)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Start reducing a sparse COO tensor over the ranks (of `process_set`) by allgathering its
    indices and values; synchronize() (or calling the handle) gives the sparse sum, with the
    values divided by the set's size for Average. Entries at the same index from different ranks
    stay separate in the result until it is coalesced."""
    tensor = tensor.coalesce()
    # allgather concatenates along dimension 0, so the indices travel one row per entry.
    value_rows, index_rows = tensor.values().contiguous(), tensor.indices().t().contiguous()
    outputs = [_allocator(value_rows), _allocator(index_rows)]
    values = core.allgather_async(_array(value_rows), name=f"{name}.values", process_set=process_set,
                                  stream=_stream(value_rows), allocate=outputs[0])
    indices = core.allgather_async(_array(index_rows), name=f"{name}.indices", process_set=process_set,
                                   stream=_stream(index_rows), allocate=outputs[1])

    def finish(results):
        gathered_values, gathered_indices = (_result(r, o) for r, o in zip(results, outputs))
        if op == Average:
            gathered_values = gathered_values / process_set.size()
        return torch.sparse_coo_tensor(gathered_indices.t(), gathered_values, tensor.shape)

    return _CallableHandle(_register([values, indices], finish))


# ----------------------------------------------------------------------------- allgather


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start concatenating every rank's `tensor` along dimension 0 (sizes may differ)."""
    output = _allocator(tensor)
    handle = core.allgather_async(_array(_source(tensor, False)), name=name, process_set=process_set,
                                  stream=_stream(tensor), allocate=output)
    return _register([handle], lambda results: _result(results[0], output))


def _grouped_async(submit, tensors, **options):
    """Submit a grouped collective whose outputs the engine sizes; synchronize() gives the list."""
    outputs = [_allocator(t) for t in tensors]
    handles = submit([_array(_source(t, False)) for t in tensors], stream=_group_stream(tensors), allocate=outputs,
                     **options)
    return _register(handles, lambda results: [_result(r, o) for r, o in zip(results, outputs)])


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Start allgathering a list of tensors as one group; synchronize() gives the list."""
    return _grouped_async(core.grouped_allgather_async, tensors, name=name, process_set=process_set)


def _allgather_grads(grad_outputs, rows, process_set):
    """Gradients of allgathered tensors of `rows` rows each on this rank: the incoming gradients
    averaged over the ranks, then this rank's rows of each."""
    grads = grouped_allreduce(list(grad_outputs), op=Average, process_set=process_set)
    rows_by_rank = allgather(torch.tensor([rows], dtype=torch.int64), process_set=process_set)  # on the host
    offsets = rows_by_rank[:process_set.rank()].sum(dim=0).tolist()
    return [g.narrow(0, offset, n) for g, offset, n in zip(grads, offsets, rows)]


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return _allgather_grads([grad_output], [ctx.rows], ctx.process_set)[0], None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenate every rank's `tensor` along dimension 0; differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None, None, *_allgather_grads(grad_outputs, ctx.rows, ctx.process_set))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgather a list of tensors as one group (negotiated together); differentiable."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ----------------------------------------------------------------------------- broadcast


def _broadcast_async(tensor, output, root_rank, name, process_set):
    in_place = output is tensor
    source = _source(tensor, in_place)
    handle = core.broadcast_async(_array(source), root_rank, name=name, output=_output_array(output, in_place),
                                  process_set=process_set, stream=_stream(tensor))
    return _register([handle], lambda _: output)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    return _broadcast_async(tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format),
                            root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class HorovodBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if core.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """`root_rank`'s value of `tensor` on every rank (of `process_set`); differentiable.
    `root_rank` is a rank of the job, as hvd.rank() numbers them, also in a process set."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


# ----------------------------------------------------------------------------- alltoall


def _alltoall_splits(splits):
    """`splits` as int64 row counts. Floats are refused here, before anything is submitted:
    cast to whole rows they would send other counts than the peers expect."""
    if splits is None:
        return None
    counts = np.asarray(splits.tolist() if torch.is_tensor(splits) else splits)
    if counts.size and counts.dtype.kind not in "iu":
        described = f"a tensor of {splits.dtype}" if torch.is_tensor(splits) else f"{counts.dtype} values"
        raise ValueError(f"alltoall: splits must be integers (rows per rank), got {described}: {counts.tolist()}")
    return counts.astype(np.int64)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Start sending `splits[i]` rows of `tensor` to the i-th rank (of `process_set`);
    synchronize() gives (received tensor, received splits), as Horovod's handle does."""
    splits = _alltoall_splits(splits)
    output = _allocator(tensor)
    handle = core.alltoall_async(_array(_source(tensor, False)), splits=splits, name=name, process_set=process_set,
                                 stream=_stream(tensor), allocate=output)

    def finish(results):
        received, received_splits = results[0]
        return _result(received, output), torch.from_numpy(received_splits.astype(np.int32))

    return _register([handle], finish)


class HorovodAlltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received_splits = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received_splits, ctx.process_set = received_splits, process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, *_):
        grad, _ = alltoall(grad_output, splits=ctx.received_splits, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Exchange rows between ranks; differentiable. Returns the received tensor, and with
    `splits` given also the received splits (a tuple), as Horovod 0.28 does."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# ----------------------------------------------------------------------------- reducescatter
# Horovod 0.28 puts process_set before the scale factors here (unlike allreduce); so do we.


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    output = _allocator(tensor)
    handle = core.reducescatter_async(_array(_source(tensor, False)), name=name, op=op,
                                      prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                      process_set=process_set, stream=_stream(tensor), allocate=output)
    return _register([handle], lambda results: _result(results[0], output))


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Start reducescattering a list of tensors as one group; synchronize() gives the list."""
    return _grouped_async(core.grouped_reducescatter_async, tensors, name=name, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor, process_set=process_set)


def _reducescatter_grads(ctx, grad_outputs):
    """Horovod 0.28's gradients of reducescattered tensors: every rank's share of the incoming
    gradients gathered back, times the forward's scale factors and, for Sum only, the size of
    the process set (for Average and the other ops, no size factor)."""
    scale = ctx.prescale_factor * ctx.postscale_factor * (ctx.process_set.size() if ctx.op == Sum else 1)
    return grouped_allgather([g * scale for g in grad_outputs], process_set=ctx.process_set)


def _save_reducescatter_context(ctx, op, process_set, prescale_factor, postscale_factor):
    ctx.op, ctx.process_set = op, process_set
    ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        _save_reducescatter_context(ctx, op, process_set, prescale_factor, postscale_factor)
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        return _reducescatter_grads(ctx, [grad_output])[0], None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce `tensor` over the ranks (of `process_set`) and keep this rank's share of
    dimension 0; differentiable."""
    compressed, context = compression.compress(tensor)
    reduced = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(reduced, context)


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        _save_reducescatter_context(ctx, op, process_set, prescale_factor, postscale_factor)
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor,
                                                             postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None, None, None, None, None, *_reducescatter_grads(ctx, grad_outputs))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reducescatter a list of tensors as one group (negotiated together); differentiable."""
    compressed = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                                *[c for c, _ in compressed])
    return [compression.decompress(r, context) for r, (_, context) in zip(reduced, compressed)]


# ----------------------------------------------------------------------------- coordination


def join(device=-1):
    """Declare this rank out of data; other ranks' allreduces continue with zeros from it.
    Blocks until every rank has joined and returns the rank that joined last."""
    return core.join()


def barrier(process_set=global_process_set):
    core.barrier(process_set)
