"""DistributedOptimizer: horovod.torch's wrapper that averages gradients across ranks.

A hook counts each gradient the moment autograd has accumulated it, and a segment's allreduce
starts as soon as all its gradients are in, so communication overlaps the rest of backward;
step() waits for them. From the second step on, where gradients are set to None between steps
and each step has one backward pass, only the gradient that completed each segment in the
step before keeps a hook: it checks that the segment's other gradients are in and new, and
submits. Each Python hook costs the thread that runs backward microseconds, which a GPU loop
bound by its host pays in full (docs/gpu.md); where the check fails (backward's order changed,
gradients not set to None), step() submits that segment and every gradient is hooked again.

Unlike Horovod, the gradients of dense parameters live in one flat tensor per device kind and
dtype (a bucket, as DistributedDataParallel's gradient_as_bucket_view), laid out alike on every
rank; on a GPU the bucket is device memory, and a segment is submitted with the stream that
computed its last gradient, so nothing waits on the host until the update reads the result.
A segment is a run of parameters next to each other in the bucket, in the order backward
reaches them, of about HVDTRAIN_SEGMENT_BYTES (DDP's bucket_cap_mb): it goes to the engine as
one region. Submitting each gradient on its own costs the training thread and the engine some
20 us a tensor, which on a GPU is a large part of a step (docs/benchmarks.md, docs/gpu.md).
Backward computes into autograd's own gradient tensors, as without hvdtrain (zero_grad() sets
them to None); a segment's are copied into its region in one batched copy when it is submitted,
and from then on p.grad is the parameter's view of the bucket.

Sparse gradients (nn.Embedding(sparse=True)) stay out of the buckets: they are reduced by
allgathering their indices and values, as Horovod does, or densified with sparse_as_dense=True;
either way the wrapped optimizer gets them back sparse.

The optimizer's state, in three parts. (An optimizer that reduces nothing, on a rank outside
the process set or in a job of one rank that is not elastic, has no hooks and stays in
NO_GRADIENT.) The step's phase (_Phase), which Horovod's checks of misuse read: step()
synchronizes first, and warns where synchronize() was called already; zero_grad() raises while
gradients arrive.

    phase            a gradient       synchronize()   step()              step() in skip_synchronize()
    NO_GRADIENT      ARRIVING         SYNCHRONIZED    NO_GRADIENT         NO_GRADIENT
    ARRIVING         ARRIVING         SYNCHRONIZED    NO_GRADIENT         ARRIVING
    SYNCHRONIZED     ARRIVING_AGAIN   SYNCHRONIZED    NO_GRADIENT, warns  NO_GRADIENT
    ARRIVING_AGAIN   ARRIVING_AGAIN   SYNCHRONIZED    NO_GRADIENT, warns  ARRIVING

Which gradients have hooks, and whether closers may submit their segments (_Hooks; * marks the
transitions that change the hooks):

    hooks                      closers distrusted (1)     synchronize()              zero_grad(set_to_none=False)
    EVERY_GRADIENT             EVERY_GRADIENT_FOR_GOOD    CLOSERS *                  EVERY_GRADIENT_FOR_GOOD
    CLOSERS                    CLOSERS_UNTIL_SYNCHRONIZE  CLOSERS                    EVERY_GRADIENT_FOR_GOOD *
    CLOSERS_UNTIL_SYNCHRONIZE  CLOSERS_UNTIL_SYNCHRONIZE  EVERY_GRADIENT_FOR_GOOD *  EVERY_GRADIENT_FOR_GOOD *
    EVERY_GRADIENT_FOR_GOOD    EVERY_GRADIENT_FOR_GOOD    EVERY_GRADIENT_FOR_GOOD    EVERY_GRADIENT_FOR_GOOD

It starts in EVERY_GRADIENT where each step has one backward pass and every parameter has a
bucket view, else in EVERY_GRADIENT_FOR_GOOD. (1) A closer found a gradient of its segment not
yet in, last step's or sparse; or a gradient arrived sparse (its parameter leaves the buckets).

A segment in a step (_SegmentState):

    segment     a member's hook (3)            its closer's hook: check passes / fails   synchronize()
    WAITING     SUBMITTED once the last is in  SUBMITTED / DEFERRED                      submits it; WAITING
    SUBMITTED   raises (2)                     raises (2)                                WAITING
    DEFERRED    (4)                            raises (2)                                submits it; WAITING

(2) Horovod's error that gradients came more than backward_passes_per_step times before step().
(3) Every gradient hooked: each counts its passes, and the segment its members still to come.
(4) None: only closers defer, and only synchronize() hooks every gradient again while they do.
"""

import collections
import itertools
import mmap
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Optional

import numpy as np
import torch

from hvdtrain import core
from hvdtrain.core import global_process_set
from hvdtrain.core.fusion import plan_segments
from hvdtrain.core.horovod_api import Adasum, Average

from . import mpi_ops
from .adasum_optimizer import _DistributedAdasumOptimizer
from .compression import Compression

from .mpi_ops import synchronize

_optimizer_ids = itertools.count()


# The states of the module's tables. Plain constants rather than enum.Enum: the hooks compare them
# and look them up in tables for every gradient, and looking up or hashing an Enum member costs
# 0.1 to 0.3 us in Python 3.11 (measured on a 2-core host), several times a class attribute's.
class _Phase:
    """Where a step is: which of Horovod's checks of misuse apply."""
    NO_GRADIENT = "no gradient since the last synchronize(), which step() followed"
    ARRIVING = "gradients arriving, their allreduces starting"
    SYNCHRONIZED = "synchronize() returned, step() to come"
    ARRIVING_AGAIN = "gradients arriving after synchronize(), step() to come"


class _Hooks:
    """Which gradients have hooks, and whether each segment's closer may submit it alone."""
    EVERY_GRADIENT = "every gradient; closers take over from the next synchronize()"
    CLOSERS = "each segment's closer only"
    CLOSERS_UNTIL_SYNCHRONIZE = "closers only, no longer trusted: every gradient from the next synchronize()"
    EVERY_GRADIENT_FOR_GOOD = "every gradient, from now on"


class _SegmentState:
    """A segment in the current step."""
    WAITING = "waiting for its gradients"
    SUBMITTED = "its allreduces started"
    DEFERRED = "left to synchronize() by its closer"


_PHASE_AFTER_A_GRADIENT = {
    _Phase.NO_GRADIENT: _Phase.ARRIVING, _Phase.ARRIVING: _Phase.ARRIVING,
    _Phase.SYNCHRONIZED: _Phase.ARRIVING_AGAIN, _Phase.ARRIVING_AGAIN: _Phase.ARRIVING_AGAIN,
}
# step() in skip_synchronize() forgets an explicit synchronize(), not gradients that came after it.
_PHASE_AFTER_A_SKIPPING_STEP = {
    _Phase.NO_GRADIENT: _Phase.NO_GRADIENT, _Phase.ARRIVING: _Phase.ARRIVING,
    _Phase.SYNCHRONIZED: _Phase.NO_GRADIENT, _Phase.ARRIVING_AGAIN: _Phase.ARRIVING,
}
_PHASES_AFTER_SYNCHRONIZE = frozenset((_Phase.SYNCHRONIZED, _Phase.ARRIVING_AGAIN))
_PHASES_OF_GRADIENTS_ARRIVING = frozenset((_Phase.ARRIVING, _Phase.ARRIVING_AGAIN))

_HOOKS_WITH_CLOSERS_DISTRUSTED = {
    _Hooks.EVERY_GRADIENT: _Hooks.EVERY_GRADIENT_FOR_GOOD, _Hooks.CLOSERS: _Hooks.CLOSERS_UNTIL_SYNCHRONIZE,
    _Hooks.CLOSERS_UNTIL_SYNCHRONIZE: _Hooks.CLOSERS_UNTIL_SYNCHRONIZE,
    _Hooks.EVERY_GRADIENT_FOR_GOOD: _Hooks.EVERY_GRADIENT_FOR_GOOD,
}
_HOOKS_AFTER_SYNCHRONIZE = {
    _Hooks.EVERY_GRADIENT: _Hooks.CLOSERS, _Hooks.CLOSERS: _Hooks.CLOSERS,
    _Hooks.CLOSERS_UNTIL_SYNCHRONIZE: _Hooks.EVERY_GRADIENT_FOR_GOOD,
    _Hooks.EVERY_GRADIENT_FOR_GOOD: _Hooks.EVERY_GRADIENT_FOR_GOOD,
}
_CLOSERS_HOOKED = frozenset((_Hooks.CLOSERS, _Hooks.CLOSERS_UNTIL_SYNCHRONIZE))


class _GradientBuckets:
    """One flat tensor per device kind and dtype holding the gradients of dense parameters."""

    def __init__(self, params, prefix):
        self.view = {}
        self.spec = {}  # param -> (bucket name, flat NumPy array) for the engine
        self.place = {}  # param -> (flat tensor, element offset, elements)
        self.flats = []
        by_kind = {}
        for p in params:
            if p.device.type in ("cpu", "cuda") and p.layout == torch.strided:
                by_kind.setdefault((p.device, p.dtype), []).append(p)
        for (device, dtype), members in by_kind.items():
            numel = sum(p.numel() for p in members)
            if device.type == "cpu":
                flat = _huge_page_zeros(numel, dtype)
            else:
                flat = torch.zeros(numel, dtype=dtype, device=device)
            # The name is the same on every rank, whichever GPU a rank has: ranks compare it.
            spec = (f"{prefix}.{device.type}.{str(dtype).replace('torch.', '')}", mpi_ops._array(flat))
            offset = 0
            for p in members:
                region = flat[offset:offset + p.numel()]
                # The gradient takes its parameter's layout (channels_last, say), as autograd
                # wants it (it would warn and copy otherwise); the engine reduces the region flat.
                self.view[p] = region.as_strided(p.shape, p.stride()) if _dense(p) else region.view_as(p)
                self.spec[p] = spec
                self.place[p] = (flat, offset, p.numel())
                offset += p.numel()
            self.flats.append(flat)

    def evict(self, p):
        """Take p out of its bucket for good, as its gradients arrive sparse (its place in the
        flat tensor stays unused: moving the others would cost more than it saves)."""
        for placement in (self.view, self.spec, self.place):
            placement.pop(p, None)

    def gather(self, params):
        """Make each parameter's gradient its bucket view: autograd's own gradients are copied
        there, all in one batched copy (DDP copies each into its bucket views); a parameter
        without a gradient gets zeros there."""
        moved, views, grads = [], [], []
        for p in params:
            view, grad = self.view[p], p.grad
            if grad is None:
                view.zero_()
                p.grad = view
            elif grad.data_ptr() != view.data_ptr():
                moved.append(p)
                views.append(view)
                grads.append(grad)
            # else accumulated into its view already (zero_grad(set_to_none=False))
        _copy_into_views(moved, views, grads)

    def zero(self):
        """zero_grad(set_to_none=False): zeros in the buckets, and the views as gradients."""
        for flat in self.flats:
            flat.zero_()
        # A parameter without a gradient yet keeps None: its first gradient may be sparse, and
        # autograd would make it dense by accumulating it into a view.
        for p, view in self.view.items():
            if p.grad is not None and not p.grad.is_sparse:
                p.grad = view


def _copy_into_views(params, views, grads):
    """Copy autograd's gradients of `params` into their bucket views, all in one batched copy,
    and make the views their gradients."""
    if views:
        torch._foreach_copy_(views, grads)
    for p, view in zip(params, views):
        p.grad = view


def _dense(tensor):
    """Whether `tensor`'s elements fill its memory without gaps or overlaps, in some order."""
    formats = [torch.contiguous_format] + {4: [torch.channels_last], 5: [torch.channels_last_3d]}.get(tensor.dim(), [])
    return any(tensor.is_contiguous(memory_format=f) for f in formats)


HUGE_PAGE_BYTES = 2 << 20


def _huge_page_zeros(numel, dtype):
    """A flat tensor of zeros on transparent huge pages where Linux offers them. MPI's
    shared-memory transport reduced ResNet-101's 178 MB of gradients 1.3x as fast from huge
    pages as from torch's own allocation, which gets 4 KiB pages (docs/benchmarks.md)."""
    nbytes = numel * dtype.itemsize
    # A smaller bucket would still get (and fill) a whole huge page.
    if nbytes < HUGE_PAGE_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.zeros(numel, dtype=dtype)
    # Private anonymous memory comes zero-filled; one huge page more lets the tensor start on a
    # huge-page boundary, which the kernel needs to back it with huge pages from its first byte.
    memory = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        memory.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without transparent huge pages: 4 KiB pages, as torch's
        pass
    whole = torch.frombuffer(memory, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE_BYTES
    return whole[start:start + nbytes].view(dtype)


@dataclass(eq=False)
class _Segment:
    """Parameters whose gradients go to the engine together, once the last of them is in."""
    members: list
    to_come: int  # members whose gradients this step still lacks, as the every-gradient hooks count them
    state: str = _SegmentState.WAITING
    runs: Optional[list] = None  # how it is submitted (_DistributedOptimizer._runs), made once
    closer: object = None  # the member whose gradient completed it last step (None: synchronize did)
    views: Optional[list] = None  # the members' bucket views, where it is submitted by its closer


@dataclass(eq=False)
class _Run:
    """One submission: a region of a bucket (`region`, a flat view, and `array`, the engine's
    view of it, kept so that the engine recognizes it from step to step), or one parameter
    outside the buckets (`region` None)."""
    name: str
    params: list
    region: Optional[torch.Tensor] = None
    array: object = None
    bucket: Optional[tuple] = None


class _DistributedOptimizer:
    """Mixed in front of the wrapped optimizer's class (see DistributedOptimizer)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set):
        super().__init__(params)
        self._process_set = process_set
        self._compression = compression
        self._backward_passes_per_step = backward_passes_per_step
        self._op = op
        self._prescale, self._postscale = 1.0, 1.0
        if op == Average:
            # The core divides by size() for Average; predividing trades range for precision.
            self._prescale, self._postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
        self._sparse_as_dense = sparse_as_dense
        all_params = [p for group in self.param_groups for p in group["params"]]
        # Horovod's attribute, which its users read: every parameter's name, the same on every rank.
        self._parameter_names = _parameter_names(named_parameters, all_params)
        # Taken on every rank, members of process_set or not, so that the buckets of the
        # optimizers made after this one are named alike everywhere.
        optimizer_id = next(_optimizer_ids)
        self._requires_update = [p for p in all_params if p.requires_grad]
        self._delay = {p: backward_passes_per_step for p in self._requires_update}
        groups = _parameter_groups(groups, self._requires_update)
        self._in_flight = []  # (handle, what to do with its result) of this step's submissions
        self._phase = _Phase.NO_GRADIENT
        self._should_synchronize = True  # Horovod's name: False within skip_synchronize()
        self._sparse_dims = {}  # parameter -> sparse_dim of its gradients, once one arrived sparse
        self._buckets = None
        self._segments = []
        # As in Horovod, on a rank outside the process set the optimizer reduces nothing: its
        # step() applies this rank's own gradients; nor in a job of one rank, unless
        # HOROVOD_ELASTIC=1 says that it is an elastic job, whose world may grow (Horovod's condition).
        if core.takes_part(process_set) and (core.running_engine(process_set).size > 1
                                             or os.environ.get("HOROVOD_ELASTIC") == "1"):
            self._buckets = _GradientBuckets(self._requires_update, f"DistributedOptimizer.{optimizer_id}")
            segment_bytes = core.running_engine(process_set).settings.segment_bytes
            self._segments = [_Segment(members, len(members)) for members in
                              _segment_members(self._requires_update, self._buckets, groups, segment_bytes)]
            self._segment_of = {p: segment for segment in self._segments for p in segment.members}
            self._hook_handles = []
            # Closers only where a gradient's arrival shows in p.grad: set to None before the
            # step, a new tensor after; with several passes, or views zeroed, it is always there.
            closers_may_submit = (backward_passes_per_step == 1
                                  and all(p in self._buckets.view for p in self._requires_update))
            self._hook(_Hooks.EVERY_GRADIENT if closers_may_submit else _Hooks.EVERY_GRADIENT_FOR_GOOD)

    def _hook(self, hooks):
        """Install the hooks that `hooks` (a _Hooks) names: on every gradient, or on each
        segment's closer (between steps only)."""
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []
        for segment in self._segments:
            if hooks not in _CLOSERS_HOOKED:
                self._hook_handles.extend(
                    p.register_post_accumulate_grad_hook(partial(self._on_gradient_ready, segment))
                    for p in segment.members)
            elif segment.closer is not None:
                segment.views = [self._buckets.view[p] for p in segment.members]
                self._hook_handles.append(segment.closer.register_post_accumulate_grad_hook(
                    partial(self._on_closing_gradient, segment)))
        self._hooks = hooks

    def _distrust_closers(self):
        """A closer can no longer tell that its segment is complete: synchronize() hooks every
        gradient again, for good."""
        self._hooks = _HOOKS_WITH_CLOSERS_DISTRUSTED[self._hooks]

    def _on_gradient_ready(self, segment, p):
        if self._delay[p] <= 0:
            _raise_too_many_passes()
        self._phase = _PHASE_AFTER_A_GRADIENT[self._phase]
        self._delay[p] -= 1
        if self._delay[p] == 0:
            segment.to_come -= 1
            if segment.to_come == 0:
                segment.closer = p
                self._submit(segment)

    def _on_closing_gradient(self, segment, _):
        if segment.state is not _SegmentState.WAITING:  # submitted, or deferred, in this step already
            _raise_too_many_passes()
        self._phase = _PHASE_AFTER_A_GRADIENT[self._phase]
        grads = []
        for p, view in zip(segment.members, segment.views):
            grad = p.grad
            # Not yet in this step, accumulated into last step's view, or sparse (it leaves the buckets).
            if grad is None or grad is view or grad.is_sparse:
                segment.state = _SegmentState.DEFERRED
                self._distrust_closers()
                return
            grads.append(grad)
        _copy_into_views(segment.members, segment.views, grads)
        self._submit_runs(segment)

    def _submit(self, segment):
        self._take_gradients(segment.members)
        self._submit_runs(segment)

    def _submit_runs(self, segment):
        segment.state = _SegmentState.SUBMITTED
        if segment.runs is None:
            segment.runs = self._runs(segment.members)
        for run in segment.runs:
            self._in_flight.append(self._submit_run(run))

    def _take_gradients(self, params):
        """Make the gradients of `params` what is reduced: bucket views (see gather); zeros where
        backward left none (a parameter unused on this rank, which the others may have used);
        a sparse gradient takes its parameter out of the buckets for good."""
        in_buckets = []
        for p in params:
            if p.grad is not None and p.grad.is_sparse and p not in self._sparse_dims:
                self._sparse_dims[p] = p.grad.sparse_dim()
                self._buckets.evict(p)
                self._segment_of[p].runs = None
                self._distrust_closers()
            if p in self._sparse_dims:
                if p.grad is None:
                    # Unused on this rank: the others still gather indices and values from it.
                    p.grad = _empty_sparse_gradient(p, self._sparse_dims[p])
            elif p in self._buckets.view:
                in_buckets.append(p)
            elif p.grad is None:
                p.grad = torch.zeros_like(p)
        self._buckets.gather(in_buckets)

    def _runs(self, members):
        """The submissions of a segment: each run of its parameters that lie next to each other
        in a bucket as one region, and each parameter outside the buckets on its own."""
        place = self._buckets.place
        placed = sorted((p for p in members if p in place), key=lambda p: (place[p][0].data_ptr(), place[p][1]))
        runs, current = [], []
        for p in placed:
            if current:
                flat, offset, numel = place[current[-1]]
                if place[p][0] is not flat or place[p][1] != offset + numel:
                    runs.append(self._region_run(current))
                    current = []
            current.append(p)
        if current:
            runs.append(self._region_run(current))
        runs.extend(_Run(f"DistributedOptimizer.{self._parameter_names[p]}", [p]) for p in members if p not in place)
        return runs

    def _region_run(self, params):
        flat, start, _ = self._buckets.place[params[0]]
        _, last, numel = self._buckets.place[params[-1]]
        region = flat[start:last + numel]
        names = [self._parameter_names[p] for p in (params if len(params) == 1 else (params[0], params[-1]))]
        return _Run("DistributedOptimizer." + "..".join(names), params, region, mpi_ops._array(region),
                    self._buckets.spec[params[0]])

    def _submit_run(self, run):
        """Start the allreduce of `run`; returns its handle and what makes the gradients of its
        result (None: the result is in place already)."""
        if run.region is not None:
            region = run.region
            compressed, context = self._compression.compress(region)
            if compressed is region:
                return mpi_ops._allreduce_async(region, region, run.name, self._op, self._prescale, self._postscale,
                                                self._process_set, bucket=run.bucket, array=run.array), None
            return (self._allreduce_in_place(compressed, run.name),
                    lambda output: region.copy_(self._compression.decompress(output, context)))
        p = run.params[0]
        if p.grad.is_sparse and not self._sparse_as_dense:
            return (mpi_ops.sparse_allreduce_async(p.grad, run.name, self._op, self._process_set),
                    lambda output: setattr(p, "grad", output))
        dense = p.grad.to_dense() if p.grad.is_sparse else p.grad
        compressed, context = self._compression.compress(dense)

        def finish(output):
            if p.grad.is_sparse:  # sparse_as_dense: the wrapped optimizer expects it sparse again
                p.grad = self._compression.decompress(output, context).to_sparse()
            elif output is not p.grad:
                p.grad.copy_(self._compression.decompress(output, context))

        return self._allreduce_in_place(compressed, run.name), finish

    def _allreduce_in_place(self, tensor, name):
        return mpi_ops.allreduce_async_(tensor, name=name, op=self._op, prescale_factor=self._prescale,
                                        postscale_factor=self._postscale, process_set=self._process_set)

    def synchronize(self):
        """Wait for every gradient's allreduce (starting those whose hooks did not fire, e.g.
        parameters unused on this rank but maybe used on another)."""
        if self._buckets is None:
            return
        # The closers' hooks count nothing: they leave passes, members to come and closers alone.
        counted = self._hooks not in _CLOSERS_HOOKED
        for segment in self._segments:
            if segment.state is not _SegmentState.SUBMITTED:
                if counted:  # completed here, not by a gradient: no closer to hook
                    segment.closer = None
                self._submit(segment)
        for handle, finish in self._in_flight:
            output = synchronize(handle)
            if finish is not None:
                finish(output)
        self._in_flight.clear()
        if counted:
            for p in self._delay:
                self._delay[p] = self._backward_passes_per_step
            for segment in self._segments:
                segment.to_come = len(segment.members)
        for segment in self._segments:
            segment.state = _SegmentState.WAITING
        self._phase = _Phase.SYNCHRONIZED
        hooks = _HOOKS_AFTER_SYNCHRONIZE[self._hooks]
        if hooks != self._hooks:
            self._hook(hooks)

    @contextmanager
    def skip_synchronize(self):
        """Let step() apply gradients already synchronized by an explicit synchronize()
        (for gradient clipping or GradScaler.unscale_ between the two)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._phase in _PHASES_AFTER_SYNCHRONIZE:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                    "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code."
                )
            self.synchronize()
            self._phase = _Phase.NO_GRADIENT
        else:
            self._phase = _PHASE_AFTER_A_SKIPPING_STEP[self._phase]
        return super().step(closure)

    def zero_grad(self, set_to_none=True):
        if self._phase in _PHASES_OF_GRADIENTS_ARRIVING or self._in_flight:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(). This is prohibited as it can cause a race condition."
            )
        if self._buckets is None or set_to_none:
            return super().zero_grad(set_to_none)
        # Backward accumulates into the views from now on: p.grad is always there, closers cannot tell.
        if self._hooks in _CLOSERS_HOOKED:
            self._hook(_Hooks.EVERY_GRADIENT_FOR_GOOD)
        else:
            self._hooks = _Hooks.EVERY_GRADIENT_FOR_GOOD
        self._buckets.zero()
        for p in self._requires_update:
            if p.grad is not None and (p not in self._buckets.view or p.grad.is_sparse):
                p.grad.zero_()


def _raise_too_many_passes():
    raise AssertionError(
        "Gradients were computed more than backward_passes_per_step times before call to step(). "
        "Increase backward_passes_per_step to accumulate gradients locally."
    )


def _segment_members(params, buckets, groups, segment_bytes):
    """The parameters of each segment. With `groups` (parameter -> group index), the groups,
    and every other parameter on its own, as Horovod reduces them. Otherwise fusion.plan_segments'
    runs of about `segment_bytes` in the order backward usually produces gradients, the reverse
    of the parameters' (0: each on its own); a run keeps to one bucket."""
    if groups:
        by_group = collections.defaultdict(list)
        for p in params:
            if p in groups:
                by_group[groups[p]].append(p)
        return list(by_group.values()) + [[p] for p in params if p not in groups]
    backward = params[::-1]
    # A parameter outside the buckets (None) is submitted on its own.
    gradients = [(buckets.spec.get(p, (None,))[0], p.numel() * p.element_size()) for p in backward]
    return [[backward[i] for i in segment] for segment in plan_segments(gradients, segment_bytes)]


def _parameter_names(named_parameters, all_params):
    if named_parameters is None:
        # Numbered over all groups (Horovod numbers each group from 0, so names repeat), and
        # without the engine's mark of the names it makes up, whose collectives it never caches.
        return {p: f"parameter.{i}" for i, p in enumerate(all_params)}
    named_parameters = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced "
                         "by model.named_parameters().")
    counts = collections.Counter(name for name, _ in named_parameters)
    duplicates = sorted(name for name, count in counts.items() if count > 1)
    if duplicates:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {', '.join(duplicates)}")
    by_id = {id(p): name for name, p in named_parameters}
    unnamed = [id(p) for p in all_params if id(p) not in by_id]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         f"Python object ids: {', '.join(map(str, unnamed))}")
    return {p: by_id[id(p)] for p in all_params}


def _parameter_groups(groups, params):
    """parameter -> group index, for parameters whose gradients must be reduced together."""
    if groups is None or groups == 0:
        return {}
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError(f"groups must be a non-negative integer or a list of lists of parameters, got {groups}")
        chunks = np.array_split(np.arange(len(params)), groups)
        return {params[i]: g for g, chunk in enumerate(chunks) for i in chunk}
    membership = {}
    for g, group in enumerate(groups):
        for p in group:
            if not any(p is q for q in params):
                raise ValueError("groups contains a parameter that this optimizer does not update")
            membership[p] = g
    return membership


def _empty_sparse_gradient(p, sparse_dim):
    return torch.sparse_coo_tensor(torch.empty(sparse_dim, 0, dtype=torch.int64),
                                   torch.empty(0, *p.shape[sparse_dim:], dtype=p.dtype), p.shape)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                         groups=None, sparse_as_dense=False, process_set=global_process_set):
    """Wrap `optimizer` so that step() applies gradients averaged (by default) over all ranks
    (of `process_set`).

    Returns an instance of a subclass of the optimizer's own class, built from its parameter
    groups (so isinstance checks and state_dict formats are unchanged). On a rank outside
    `process_set` it reduces nothing: step() applies that rank's own gradients, as in Horovod.
    With op=Adasum in a job of more than one rank, the ranks combine the updates of their own
    optimizers instead (adasum_optimizer.py)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning)
        if groups is None:
            groups = num_groups
    if op == Adasum and core.size() > 1:
        if process_set != global_process_set:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        all_params = [p for group in optimizer.param_groups for p in group["params"]]
        # Refused here, with the engine's own rule, not from inside the first backward
        refusal = core.adasum_refusal(on_device=any(p.is_cuda for p in all_params))
        if refusal is not None:
            raise NotImplementedError(refusal)
        names = _parameter_names(named_parameters, all_params)
        cls = type(optimizer.__class__.__name__, (_DistributedAdasumOptimizer, optimizer.__class__), {})
        return cls(optimizer.param_groups, names, compression, backward_passes_per_step)
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
