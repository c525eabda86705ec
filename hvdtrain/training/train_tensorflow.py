"""Data-parallel training with TensorFlow 2 and Keras on `hvdtrain.tensorflow`: train_torch.py's
story, told with TensorFlow, so that a recipe means the same in both frameworks.

Every rank runs `train(cfg, run_dir, device)`: init -> build the task (a Keras model, input
sharded as in the PyTorch loop) -> the shared loop (loop.py: start or resume, epochs of steps,
checkpoints, evaluation, progress) with TensorFlow's part of each, through the same
framework-neutral modules.

Two choices keep the semantics of the PyTorch loop:
- The update is torch.optim.SGD's (`SGD` below), not Keras's SGD: Keras decays the weights apart
  from the gradient and keeps the LR inside its momentum; PyTorch adds the weight decay to the
  gradient and keeps the LR out of the momentum buffer (Goyal et al.'s momentum correction).
- Each backward pass's gradients are summed on the rank and the sums averaged over the ranks in
  one grouped allreduce per step, as Horovod's DistributedOptimizer does with
  backward_passes_per_step; hvd.DistributedGradientTape would reduce after every pass.
A checkpoint's state is a NumPy .npz archive of arrays, read with allow_pickle=False, so loading
one runs no code. TensorFlow's op determinism is on: a resumed run repeats the
interrupted one bit for bit.
"""

import io
import time

import keras
import numpy as np
import tensorflow as tf

import hvdtrain.tensorflow as hvd
from hvdtrain.training import loop, sharding
from hvdtrain.run.hosts import job_hosts
from hvdtrain.run.plan import make_plan
from hvdtrain.tasks.data_tensorflow import build_datasets
from hvdtrain.tasks.models_tensorflow import build_model


def train(cfg, run_dir, device):
    """`device`: the run.devices.Device every rank agreed on (cpu, or cuda: the GPU of the local rank).
    Images are channels last in TensorFlow already (train.channels_last changes nothing here)."""
    session_start = time.time()
    hvd.init()
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(f"recipe.framework=tensorflow trains with TensorFlow, but Keras runs on "
                           f"{keras.backend.backend()} (KERAS_BACKEND): set KERAS_BACKEND=tensorflow or leave it unset")
    _use_device(device.kind)
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(cfg.train.seed)
    # bfloat16 needs no loss scaling, on the CPU or a GPU; fp16 is refused for this loop (run/config/train.py)
    if cfg.train.autocast == "bf16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    train_set, val_set = build_datasets(cfg.data, cfg.model.num_classes, cfg.train.seed)
    plan = make_plan(cfg, job_hosts(), device, train_size=len(train_set))
    passes = cfg.train.backward_passes_per_step

    model = build_model(cfg.model, cfg.data.image_size)
    optimizer = SGD(model, cfg.optimizer, plan.base_lr)

    def epoch_batches(epoch, indices):
        seeds = [sharding.sample_seed(cfg.train.seed, epoch, i) for i in indices]
        return iter(train_set.batches(indices, cfg.train.batch_size, seeds))

    def step(batches, lr, global_step):
        optimizer.set_learning_rate(lr)
        return _train_step(model, optimizer, batches, passes)

    loop.run(cfg, plan, run_dir, session_start, len(train_set),
             decode=_decode, restore=lambda state: _restore(state, model, optimizer),
             broadcast_initial=lambda: hvd.broadcast_variables(model.weights, root_rank=0),
             epoch_batches=epoch_batches, train_step=step,
             evaluate=(lambda: evaluate(model, val_set, cfg)) if len(val_set) else None,
             checkpoint_state=lambda: _checkpoint_state(model, optimizer))


def _train_step(model, optimizer, batches, passes):
    """One optimizer step: `passes` backward passes summed on this rank, averaged over the ranks,
    one update. Returns this rank's mean loss as a tensor, read only when the progress report
    records it (reading it waits for the device)."""
    total, sums = 0.0, None
    for _ in range(passes):
        loss, gradients = _gradients(model, *next(batches), passes)
        sums = gradients if sums is None else [s + g for s, g in zip(sums, gradients)]
        total = total + loss
    _update(optimizer, sums, tf.constant(optimizer.lr, tf.float32))
    return total / passes


# The step's functions hold no Python control flow on tensors, so they are traced as written, as
# Keras traces its own train step: autograph's conversion of SGD.apply's loop over every variable
# took seconds of each rank's start with ResNet-50.
@tf.function(autograph=False)
def _gradients(model, images, labels, passes):
    with tf.GradientTape() as tape:
        loss = _cross_entropy(model(images, training=True), labels)
        share = loss / passes
    return loss, tape.gradient(share, model.trainable_variables)


@tf.function(autograph=False)
def _update(optimizer, gradients, lr):
    optimizer.apply(hvd.grouped_allreduce(gradients, op=hvd.Average, name="gradients"), lr)


def _cross_entropy(logits, labels, reduce=tf.reduce_mean):
    return reduce(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32)))


class SGD:
    """torch.optim.SGD's update: g <- grad + weight_decay w; v <- momentum v + g; w <- w - lr g'
    with g' = v, or g + momentum v (Nesterov) -- which is the update of TensorFlow's fused
    momentum kernel. Weight decay applies to every variable except, as the recipe asks,
    BatchNorm's gamma and beta ("bn") and the biases of other layers ("bias")."""

    def __init__(self, model, optimizer_cfg, lr):
        excluded = set(optimizer_cfg.exclude_from_weight_decay)
        batch_norm = {id(v) for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)
                      for v in layer.trainable_variables}
        self.variables = model.trainable_variables
        kinds = ["bn" if id(v) in batch_norm else "bias" if v.name == "bias" else "weight" for v in self.variables]
        self.weight_decays = [0.0 if kind in excluded else optimizer_cfg.weight_decay for kind in kinds]
        self.momentum, self.nesterov = optimizer_cfg.momentum, optimizer_cfg.nesterov
        self.momentum_correction = optimizer_cfg.momentum_correction
        self.buffers = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in self.variables]
        self.lr = lr  # of the last update

    def set_learning_rate(self, lr):
        """As train_torch._set_learning_rate: without momentum correction the buffer behaves as
        in the form v <- m v + lr g, which after an LR change still carries the old LR."""
        if not self.momentum_correction and lr != self.lr:
            for buffer in self.buffers:
                buffer.assign(buffer * (self.lr / lr))
        self.lr = lr

    def apply(self, gradients, lr):
        for variable, gradient, decay, buffer in zip(self.variables, gradients, self.weight_decays, self.buffers,
                                                     strict=True):
            if decay:
                gradient = gradient + decay * variable
            tf.raw_ops.ResourceApplyMomentum(var=variable.value.handle, accum=buffer.handle, lr=lr, grad=gradient,
                                             momentum=self.momentum, use_nesterov=self.nesterov)


def evaluate(model, val_set, cfg):
    """Validation metrics over the whole validation set: each rank evaluates its shard and the
    sums (loss, correct top-1, correct top-5, samples) are added up across ranks, exactly."""
    _average_statistics(model)
    totals = np.zeros(4)
    indices = sharding.eval_shard(len(val_set), hvd.rank(), hvd.size())
    for images, labels in val_set.batches(indices, cfg.train.batch_size):
        totals += np.array(_evaluation_sums(model, images, labels), np.float64)
    loss, top1, top5, count = hvd.allreduce(tf.constant(totals), op=hvd.Sum, name="eval.totals").numpy().tolist()
    return {"val_loss": loss / count, "val_top1": 100.0 * top1 / count, "val_top5": 100.0 * top5 / count}


@tf.function(reduce_retracing=True, autograph=False)
def _evaluation_sums(model, images, labels):
    logits = tf.cast(model(images, training=False), tf.float32)
    ranked = tf.math.top_k(logits, min(5, logits.shape[1])).indices == tf.cast(labels[:, None], tf.int32)
    return [_cross_entropy(logits, labels, reduce=tf.reduce_sum), tf.math.count_nonzero(ranked[:, 0]),
            tf.math.count_nonzero(tf.reduce_any(ranked, axis=1)), tf.size(labels)]


def _average_statistics(model):
    """Average BatchNorm's moving statistics over the ranks (each saw different data), so that
    every shard is evaluated, and every checkpoint saved, with one and the same model."""
    statistics = [v for v in model.non_trainable_variables if "float" in v.dtype]
    averaged = hvd.grouped_allreduce(statistics, op=hvd.Average, name="batch_norm.statistics")
    for variable, value in zip(statistics, averaged):
        variable.assign(value)


def _restore(state, model, optimizer):
    for variable in model.weights:
        variable.assign(state["model"][variable.path])
    for variable, buffer in zip(optimizer.variables, optimizer.buffers):
        buffer.assign(state["momentum"][variable.path])
    optimizer.lr = state["lr"]


def _checkpoint_state(model, optimizer):
    """The bytes of a checkpoint's TensorFlow state, on rank 0: weights, momentum buffers and the
    last LR (for set_learning_rate without momentum correction)."""
    _average_statistics(model)
    if hvd.rank() != 0:
        return None
    arrays = {f"model/{v.path}": v.numpy() for v in model.weights}
    arrays.update({f"momentum/{v.path}": b.numpy() for v, b in zip(optimizer.variables, optimizer.buffers)})
    buffer = io.BytesIO()
    np.savez(buffer, lr=np.array(optimizer.lr), **arrays)
    return buffer.getvalue()


def _decode(data):
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    state = {"lr": float(arrays.pop("lr"))}
    for part in ("model", "momentum"):
        state[part] = {name[len(part) + 1:]: array for name, array in arrays.items() if name.startswith(part + "/")}
    return state


def _use_device(kind):
    """One GPU per rank, the local rank's among those it sees (run/devices.py), or the CPU."""
    if kind == "cpu":
        tf.config.set_visible_devices([], "GPU")
        return
    gpus = tf.config.list_physical_devices("GPU")
    mine = gpus[hvd.local_rank() % len(gpus)]
    tf.config.experimental.set_memory_growth(mine, True)
    tf.config.set_visible_devices(mine, "GPU")
