"""Horovod's collectives on TensorFlow tensors: eagerly, inside tf.function, and in TF1 graphs
run by a tf.compat.v1.Session.

Every collective hands NumPy arrays to the core (hvdtrain.core) and turns its results back
into tensors without copying on the CPU:
- eagerly, `np.asarray` views a tensor's memory and DLPack wraps the result arrays;
- inside a tf.function, the same NumPy function runs as a `tf.numpy_function` op, which
  TensorFlow feeds with views of its tensors and whose returned arrays it adopts;
- in a TF1 graph, as the ops of session_graphs.py, which hold no thread while they wait.
Inside a tf.function each collective blocks one of TensorFlow's threads until its peers arrive,
so every rank must run the function's collectives in the same order: TensorFlow runs
independent ops in any order, and ranks that picked different ones would each wait for a
collective the others have not started. Each collective op therefore depends on the one built
before it in the same function (the order of the Python code, the same on every rank).
tf.function orders its own stateful ops so, but not the backward function of a tf.function
differentiated outside it. A session may fetch any subset of a graph's collectives, so no fixed
order fits there: hence session_graphs.py.

Errors are Horovod's TensorFlow errors: ranks that disagree about a collective get
tf.errors.FailedPreconditionError eagerly and from a session's run (inside a tf.function
TensorFlow turns any error of a Python op into UnknownError, whose message names it), bad
arguments InvalidArgumentError.

Names are deterministic on every rank: the caller's `name`; inside a graph, Horovod's name
built from the input tensor's name; eagerly, the core numbers unnamed collectives in call
order. Several tensors handed over at once cross in one op and wait together.

Tensors on a GPU are staged through host memory and reduced by MPI: TensorFlow copies them to
the host for np.asarray and numpy_function, and eager results go back to the input's device.
NCCL for TensorFlow (DLPack to CuPy buffers for the core's NCCL backend, as hvdtrain.torch
does) is not there yet: the pinned TensorFlow is tensorflow-cpu.
"""

import re
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record

from hvdtrain import core
from hvdtrain.core import global_process_set
from hvdtrain.core.process_sets import process_set_by_id
from hvdtrain.core.horovod_api import Adasum, Average, Sum, handle_average_backwards_compatibility

from . import session_graphs
from .compression import Compression



# ----------------------------------------------------------------------------- tensors <-> core


def _run_on_core(start, tensors, dtypes, kind):
    """The results, as tensors, of `start(arrays)`, which hands the tensors' memory to the core
    and returns a function that waits for the collective and gives its result arrays."""
    if tf.executing_eagerly():
        arrays = [np.asarray(t) for t in tensors]
        results = [_tensor(result) for result in _with_horovod_errors(lambda: start(arrays)())()]
        device = tensors[0].device if tensors else ""
        if "GPU" not in device.upper():
            return results
        with tf.device(device):  # where the caller's tensor was, as Horovod's GPU ops return it
            return [tf.identity(result) for result in results]
    if session_graphs.in_session_graph():
        # Errors of the arguments stay ValueError and TypeError in the start op, which TensorFlow
        # turns into InvalidArgumentError; the wait's are translated as they are eagerly.
        return session_graphs.run_on_core(lambda arrays: _with_horovod_errors(start(arrays)), tensors, dtypes, kind)
    graph = tf.compat.v1.get_default_graph()
    previous = _last_collective_op.get(graph)
    with tf.control_dependencies([] if previous is None else [graph.get_operation_by_name(previous)]):
        # Inside a graph, TensorFlow hands 0-d inputs over as NumPy scalars; a ValueError or
        # TypeError raised there reaches the caller as InvalidArgumentError.
        results = tf.numpy_function(lambda *arrays: start([np.asarray(a) for a in arrays])(), list(tensors),
                                    list(dtypes), stateful=True, name=f"Horovod{kind}")
    if not dtypes:
        _last_collective_op[graph] = results.name  # an op without outputs
        return []
    _last_collective_op[graph] = results[0].op.name
    return results


# The name of the newest collective op of each graph (tf.function, backward function, branch),
# which the next one built there waits for. A name, not the op: the op would keep its graph, the
# key, alive.
_last_collective_op = weakref.WeakKeyDictionary()


# ----------------------------------------------------------------------------- gradients

_GRADIENT = "HvdtrainCollective"


def _differentiable(forward):
    """tf.custom_gradient for the collectives below, whose `forward(*inputs)` returns (results,
    gradient function). Eagerly it is tf.custom_gradient. In a graph (TF1 or tf.function),
    tf.custom_gradient registers every call's gradient function under a new name in
    TensorFlow's global gradient registry, where it keeps its graph alive for good; here the
    results pass through an IdentityN op whose one registered gradient (_passed_gradient) finds
    the call's function on that op, so that the graph owns it. As tf.custom_gradient does, the
    call is also recorded on the tapes watching it (a GradientTape inside a tf.function)."""

    def differentiated(*inputs):
        if tf.executing_eagerly():
            return tf.custom_gradient(forward)(*inputs)
        inputs = [tf.convert_to_tensor(t) for t in inputs]
        results, gradient = forward(*inputs)
        count = len(results)

        def backward(*upstream):
            # IdentityN passes the inputs through as well, which have no gradient of their own
            return [None] * count + list(gradient(*upstream[:count]))

        graph = tf.compat.v1.get_default_graph()
        with graph.gradient_override_map({"IdentityN": _GRADIENT}):
            passed = tf.identity_n(list(results) + inputs)
        passed[0].op._hvdtrain_gradient = backward
        record.record_operation(forward.__name__, passed, list(results) + inputs, backward)
        return type(results)(passed[:count])

    return differentiated


@tf.RegisterGradient(_GRADIENT)
def _passed_gradient(op, *upstream):
    try:
        backward = op._hvdtrain_gradient
    except AttributeError:  # the op of a graph copied or imported: its Python function stayed behind
        raise LookupError(f"the gradient of hvdtrain's collective {op.name} is only known in the graph that "
                          "built it; differentiate it there") from None
    return backward(*upstream)


def _with_horovod_errors(run):
    """`run` raising the errors Horovod's TensorFlow ops raise (eagerly; see the module's doc)."""

    def translated():
        try:
            return run()
        except core.TensorMismatchError as error:
            raise tf.errors.FailedPreconditionError(None, None, str(error)) from error
        except (ValueError, TypeError) as error:
            if not core.is_initialized():
                raise  # "use hvd.init()": Horovod's ValueError too
            raise tf.errors.InvalidArgumentError(None, None, str(error)) from error

    return translated


# TensorFlow's CPU kernels require the memory under a tensor to start at this boundary.
_ALIGNMENT = 64


def _tensor(array):
    """The tensor over a result array's memory (the core returns fresh, writable arrays);
    a copy when the memory is not aligned for TensorFlow."""
    if array.ctypes.data % _ALIGNMENT:
        return tf.convert_to_tensor(array)
    if array.dtype.name == "bfloat16":  # DLPack has no bfloat16: hand over the bits, reinterpret them
        return tf.bitcast(_tensor(array.view(np.uint16)), tf.bfloat16)
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())


def _aligned_empty_like(array):
    """An uninitialized array like `array`, aligned so that its result crosses back uncopied."""
    buffer = np.empty(array.nbytes + _ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % _ALIGNMENT
    return buffer[start:start + array.nbytes].view(array.dtype).reshape(array.shape)


def _collective_name(kind, tensors, name, ignore_name_scope):
    """Horovod's names. Inside a graph an unnamed collective is named after its input tensors
    and a named one is prefixed with the name scope unless ignore_name_scope; eagerly an
    unnamed one stays None, for the core to number in call order."""
    if tf.executing_eagerly():
        return name
    if name is None:
        ends = [tensors[0].name] if len(tensors) == 1 else [tensors[0].name, tensors[-1].name]
        return f"Horovod{kind}_" + "_".join(re.sub("[^a-zA-Z0-9_]", "_", n) for n in ends)
    scope = "" if ignore_name_scope else tf.get_current_name_scope()
    return f"{scope}/{name}" if scope else name


def _suffixed(name, suffix):
    return None if name is None else name + suffix


def _gradient_name(name, suffix, kind, tensors):
    """The name of a collective in a gradient of the collective `name`, which takes `tensors`.
    Eagerly, `name` with `suffix`. In a graph, Horovod's name after `tensors`: each gradient
    taken of one collective (tf.gradients called for each of its outputs) builds a collective of
    its own, which a session may run at once with the others, and names in flight must differ."""
    if tf.executing_eagerly():
        return _suffixed(name, suffix)
    return _collective_name(kind, tensors, None, ignore_name_scope=True)


def _member_names(name, count):
    """One tensor takes the collective's name; several are numbered after it, as the core
    numbers the members of a group."""
    if count == 1:
        return [name]
    return [_suffixed(name, f"_{i}") for i in range(count)]


def _waiting(handles):
    """A function that waits for the handles and gives their results."""
    return lambda: [handle.wait() for handle in handles]


def _with_static_shapes(results, shapes):
    for result, shape in zip(results, shapes):
        result.set_shape(shape)


def _ragged_shape(tensor):
    """The static shape of a result whose first dimension depends on the other ranks."""
    return tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else tensor.shape


# ----------------------------------------------------------------------------- the collectives


def _reduce(tensors, name, op, prescale, postscale, process_set):
    """Allreduce `tensors` in one crossing: one tensor under `name`, several as one group
    (negotiated and fused together). Differentiable as in Horovod: the gradient is the same
    reduction of the incoming gradients."""

    @_differentiable
    def reduce(*inputs):
        def start(arrays):
            outputs = [_aligned_empty_like(a) for a in arrays]
            options = dict(op=op, prescale_factor=prescale, postscale_factor=postscale, process_set=process_set)
            if len(arrays) == 1:
                return _waiting([core.allreduce_async(arrays[0], name=name, output=outputs[0], **options)])
            return _waiting(core.grouped_allreduce_async(arrays, name=name, outputs=outputs, **options))

        results = _run_on_core(start, inputs, [t.dtype for t in inputs], "Allreduce")
        _with_static_shapes(results, [t.shape for t in inputs])

        def grad(*upstream):
            upstream = _zeros_for_none(upstream, results)
            return _reduce(upstream, _gradient_name(name, ".grad", "Allreduce", upstream), op, prescale, postscale,
                           process_set)

        return results, grad

    return reduce(*tensors)


def _gather(tensors, name, process_set):
    """Allgather each tensor along its first dimension, which may differ between ranks.
    Gradient (Horovod's): the incoming gradient averaged over ranks, of which each rank
    keeps the rows it contributed."""

    @_differentiable
    def gather(*inputs):
        names = _member_names(name, len(inputs))

        def start(arrays):
            return _waiting([core.allgather_async(a, name=n, process_set=process_set) for a, n in zip(arrays, names)])

        results = _run_on_core(start, inputs, [t.dtype for t in inputs], "Allgather")
        _with_static_shapes(results, [_ragged_shape(t) for t in inputs])

        def grad(*upstream):
            upstream = _zeros_for_none(upstream, results)
            reduced = _reduce(upstream, _gradient_name(name, ".grad", "Allreduce", upstream), Average, 1.0, 1.0,
                              process_set)
            rows = [tf.shape(t, out_type=tf.int64)[:1] for t in inputs]
            rows_by_rank = _gather(rows, _gradient_name(name, ".grad_rows", "Allgather", rows), process_set)
            position = process_set.rank()
            return [g[tf.reduce_sum(counts[:position]):][:own[0]]
                    for g, counts, own in zip(reduced, rows_by_rank, rows)]

        return results, grad

    return gather(*tensors)


def _broadcast(tensors, root_rank, name, process_set):
    """Every rank receives root_rank's tensors. Gradient (Horovod's): the incoming gradient
    averaged over ranks on the root, zero elsewhere."""

    @_differentiable
    def broadcast(*inputs):
        names = _member_names(name, len(inputs))

        def start(arrays):
            outputs = [_aligned_empty_like(a) for a in arrays]
            return _waiting([core.broadcast_async(a, root_rank, name=n, output=o, process_set=process_set)
                             for a, n, o in zip(arrays, names, outputs)])

        results = _run_on_core(start, inputs, [t.dtype for t in inputs], "Broadcast")
        _with_static_shapes(results, [t.shape for t in inputs])

        def grad(*upstream):
            upstream = _zeros_for_none(upstream, results)
            reduced = _reduce(upstream, _gradient_name(name, ".grad", "Allreduce", upstream), Average, 1.0, 1.0,
                              process_set)
            if core.rank() == root_rank:
                return reduced
            # The zeros wait for the reduction: a graph would otherwise drop it on these ranks
            # only, and the root would wait for them forever.
            with tf.control_dependencies(reduced):
                return [tf.zeros_like(g) for g in reduced]

        return results, grad

    return broadcast(*tensors)


def _alltoall(tensor, splits, name, process_set):
    """Send splits[i] rows to rank i; returns the rows received and how many came from each
    rank (an empty `splits` divides the rows evenly). Gradient: the reverse exchange."""

    @_differentiable
    def exchange(rows, row_splits):
        def start(arrays):
            array, split_array = arrays
            handle = core.alltoall_async(array, splits=split_array if split_array.size else None, name=name,
                                         process_set=process_set)

            def wait():
                received, received_splits = handle.wait()
                return [received, received_splits.astype(np.int32)]

            return wait

        received, received_splits = _run_on_core(start, [rows, row_splits], [rows.dtype, tf.int32], "Alltoall")
        _with_static_shapes([received, received_splits], [_ragged_shape(rows), [process_set.size()]])

        def grad(upstream_rows, upstream_splits):
            upstream_rows = _zeros_for_none([upstream_rows], [received])[0]
            return _alltoall(upstream_rows, received_splits,
                             _gradient_name(name, ".grad", "Alltoall", [upstream_rows]), process_set)[0], None

        return (received, received_splits), grad

    return exchange(tensor, splits)


def _reducescatter(tensors, name, op, prescale, postscale, process_set):
    """Reduce each tensor and give every rank its share of the first dimension. Gradient
    (Horovod's): allgather of the incoming gradients times the scale factors, and times the
    size for Sum."""

    @_differentiable
    def scatter(*inputs):
        names = _member_names(name, len(inputs))

        def start(arrays):
            return _waiting([core.reducescatter_async(a, name=n, op=op, prescale_factor=prescale,
                                                      postscale_factor=postscale, process_set=process_set)
                             for a, n in zip(arrays, names)])

        results = _run_on_core(start, inputs, [t.dtype for t in inputs], "Reducescatter")
        _with_static_shapes(results, [_ragged_shape(t) for t in inputs])

        def grad(*upstream):
            factor = prescale * postscale * (process_set.size() if op == Sum else 1)
            upstream = [g * tf.cast(factor, g.dtype) for g in _zeros_for_none(upstream, results)]
            return _gather(upstream, _gradient_name(name, ".grad", "Allgather", upstream), process_set)

        return results, grad

    return scatter(*tensors)


def _zeros_for_none(upstream, results):
    return [tf.zeros_like(r) if u is None else u for u, r in zip(upstream, results)]


# ----------------------------------------------------------------------------- Horovod's API


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduce a tf.Tensor, tf.Variable or tf.IndexedSlices over the ranks (of `process_set`;
    default: average). IndexedSlices are allgathered instead, which represents their sum."""
    return grouped_allreduce([tensor], average, device_dense, device_sparse, compression, op, prescale_factor,
                             postscale_factor, name=name, process_set=process_set,
                             ignore_name_scope=ignore_name_scope)[0]


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
                      ignore_name_scope=False):
    """Reduce a list of tensors as one group: negotiated together and fused where possible."""
    if not tensors:
        return tensors
    op = handle_average_backwards_compatibility(op, average)
    results = list(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse:
        with tf.device(device_sparse):
            reduced = _allreduce_slices([tensors[i] for i in sparse], op, prescale_factor, postscale_factor,
                                        _suffixed(name, ".slices"), ignore_name_scope, process_set)
        for i, slices in zip(sparse, reduced):
            results[i] = slices
    if dense:
        with tf.device(device_dense):
            compressed, contexts = zip(*[compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense])
            reduced = _reduce(list(compressed), _collective_name("Allreduce", compressed, name, ignore_name_scope),
                              op, prescale_factor, postscale_factor, process_set)
            for i, tensor, context in zip(dense, reduced, contexts):
                results[i] = compression.decompress(tensor, context)
    return results


def _allreduce_slices(slices, op, prescale_factor, postscale_factor, name, ignore_name_scope, process_set):
    """Horovod reduces IndexedSlices by allgathering their values and indices; the
    concatenation represents the sum, and dividing the values by the size the average."""
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction does not currently support sparse tensors. As a workaround "
                                  "please pass sparse_as_dense=True to DistributedOptimizer")
    if op not in (Sum, Average):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
    parts = [s.values for s in slices] + [s.indices for s in slices]
    gathered = _gather(parts, _collective_name("Allgather", parts, name, ignore_name_scope), process_set)
    values, indices = gathered[:len(slices)], gathered[len(slices):]
    if op == Average:
        values = [v / tf.cast(process_set.size(), v.dtype) for v in values]
    return [tf.IndexedSlices(v, i, dense_shape=s.dense_shape) for v, i, s in zip(values, indices, slices)]


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenate every rank's tensor along the first dimension (which may differ per rank)."""
    tensor = tf.convert_to_tensor(tensor)
    return _gather([tensor], _collective_name("Allgather", [tensor], name, ignore_name_scope), process_set)[0]


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    if not tensors:
        return tensors
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    return _gather(tensors, _collective_name("GroupedAllgather", tensors, name, ignore_name_scope), process_set)


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """root_rank's tensor, on every rank (of `process_set`; `root_rank` numbered as hvd.rank())."""
    tensor = tf.convert_to_tensor(tensor)
    return _broadcast([tensor], root_rank, _collective_name("Broadcast", [tensor], name, ignore_name_scope),
                      process_set)[0]


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Assign root_rank's values to `variables` on every rank, all in one crossing; returns
    the new values."""
    variables = list(variables)
    if not variables:
        return []
    values = [tf.convert_to_tensor(v) for v in variables]
    received = _broadcast(values, root_rank, _collective_name("Broadcast", values, name, True), process_set)
    assigned = [variable.assign(value) for variable, value in zip(variables, received)]
    # In a TF1 graph nothing happens until a session runs the assignments, which give the values.
    return assigned if session_graphs.in_session_graph() else received


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assign root_rank's values to `variables` on every rank; in a TF1 graph, the op that does
    so. `inplace` is accepted for Horovod's signature: the values are always assigned into the
    variables."""
    assigned = broadcast_(variables, root_rank, process_set=process_set)
    if session_graphs.in_session_graph():
        return tf.group(*assigned)
    return None


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Send `splits[i]` rows of `tensor` to the i-th rank (of `process_set`; default: an even
    split). Returns the rows received, and with `splits` given also how many rows came from each."""
    tensor = tf.convert_to_tensor(tensor)
    split_tensor = tf.zeros([0], tf.int32) if splits is None else tf.cast(splits, tf.int32)
    received, received_splits = _alltoall(tensor, split_tensor,
                                          _collective_name("Alltoall", [tensor], name, ignore_name_scope),
                                          process_set)
    return received if splits is None else (received, received_splits)


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce `tensor` over the ranks (of `process_set`) and give each its share of the first
    dimension (the first `dim % size` ranks get one more row)."""
    return grouped_reducescatter([tensor], device_dense, compression, op, prescale_factor, postscale_factor,
                                 name=name, process_set=process_set, ignore_name_scope=ignore_name_scope)[0]


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average, prescale_factor=1.0,
                          postscale_factor=1.0, name=None, process_set=global_process_set, ignore_name_scope=False):
    if not tensors:
        return tensors
    with tf.device(device_dense):
        compressed, contexts = zip(*[compression.compress(tf.convert_to_tensor(t)) for t in tensors])
        reduced = _reducescatter(list(compressed), _collective_name("Reducescatter", compressed, name,
                                                                    ignore_name_scope),
                                 op, prescale_factor, postscale_factor, process_set)
        return [compression.decompress(t, context) for t, context in zip(reduced, contexts)]


def join():
    """Declare that this rank has run out of data; the others' allreduces go on with zeros
    from it. Returns (as an int32 tensor) the last rank to join, once all have."""
    def start(arrays):
        handle = core.join_async()
        return lambda: [np.asarray(handle.wait(), np.int32)]

    last = _run_on_core(start, [], [tf.int32], "Join")[0]
    last.set_shape([])
    return last


def barrier(process_set=global_process_set):
    """Return once every rank (of `process_set`) has reached the barrier; in a TF1 graph, the op
    that does so."""
    def start(arrays):
        handle = core.barrier_async(process_set)
        return lambda: handle.wait() or []

    ops = _run_on_core(start, [], [], "Barrier")
    return ops[0] if ops else None


# Objects cross through the core directly, in TF1 as in TF2: Horovod's `session` argument, which
# ran its TF1 ops, is accepted and not needed.


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """root_rank's picklable object, on every rank."""
    return core.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function that broadcasts its argument as broadcast_object(obj, root_rank) does."""
    return lambda obj: broadcast_object(obj, root_rank, name=name, process_set=process_set)


def broadcast_global_variables(root_rank):
    """The op that assigns root_rank's values to every global variable of a TF1 graph (tf.compat.v1's
    collection, which eager TensorFlow does not keep)."""
    if not session_graphs.in_session_graph():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. Please use "
                           "`hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """The list of every rank's picklable object, in rank order."""
    return core.allgather_object(obj, name=name, process_set=process_set)


def size_op(process_set_id=0, name=None):
    return tf.constant(process_set_by_id(process_set_id).size(), tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    """1 where this rank belongs to the process set of that id, else 0."""
    return tf.constant(int(process_set_by_id(process_set_id).included()), tf.int32, name=name)


def cross_size_op(name=None):
    return tf.constant(core.cross_size(), tf.int32, name=name)


def cross_rank_op(name=None):
    return tf.constant(core.cross_rank(), tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(core.local_size(), tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(core.rank(), tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(core.local_rank(), tf.int32, name=name)


def gpu_available(ext_base_name, verbose=False):
    """Horovod's helper, which its tests call as hvd.gpu_available("tensorflow"): whether the
    framework of that name ("tensorflow" or "torch") sees a GPU here."""
    if ext_base_name == "tensorflow":
        return bool(tf.config.list_physical_devices("GPU"))
    if ext_base_name != "torch":
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
