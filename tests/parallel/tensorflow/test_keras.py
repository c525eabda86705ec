"""hvdtrain.keras (hvdtrain/tensorflow/keras/) on 2 real ranks, under Keras 3 and under tf-keras
(TF_USE_LEGACY_KERAS=1): model.fit with DistributedOptimizer equals one process with the whole
batch, and so do tf-keras's minimize() and Horovod's _compute_gradients() path; the callbacks
broadcast, average metrics and warm the learning rate up as Horovod's do; local variables keep
each rank's own gradients and values; SyncBatchNormalization (a Keras layer, from
hvdtrain/tensorflow/sync_batch_norm.py) normalizes over the global batch; BestModelCheckpoint
writes from rank 0 only; a model saved and loaded with load_model trains on as if never stopped;
and what Horovod rejects is refused with a clear error.

TensorFlow takes seconds to import, so each Keras runs all its checks in one job of two ranks."""

import os
import shutil
import tempfile

import numpy as np
import pytest

FEATURES, BATCH, EPOCHS = 5, 4, 2


def _started():
    """TensorFlow and hvdtrain.keras, initialized, Keras computing in float64."""
    import tensorflow as tf

    import hvdtrain.keras as hvd

    hvd.init()
    tf.keras.backend.set_floatx("float64")
    return tf, hvd


def _shared_folder(hvd):
    """A temporary folder made by rank 0, whose name every rank gets."""
    from hvdtrain.tensorflow import broadcast_object

    return broadcast_object(tempfile.mkdtemp(prefix="keras-test-") if hvd.rank() == 0 else None, root_rank=0)


def _remove_once_all_are_done(hvd, folder):
    from hvdtrain.tensorflow import allgather_object

    allgather_object(None)
    if hvd.rank() == 0:
        shutil.rmtree(folder)


def _data(n):
    rng = np.random.default_rng(3)
    features = rng.normal(size=(8 * n * BATCH, FEATURES))
    return features, np.tanh(features @ rng.normal(size=(FEATURES, 1)))


def _model(tf, seed):
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(6, activation="tanh"),
                                tf.keras.layers.Dense(1)])


def _rows_of_rank(n, r, passes_total, batch=BATCH):
    """This rank's rows, in order: its share of every global batch of n*batch rows."""
    return np.concatenate([np.arange(p * n * batch + r * batch, p * n * batch + (r + 1) * batch)
                           for p in range(passes_total)])


def _fit_alone(tf, features, targets, batch_size, initial_weights):
    model = _model(tf, 0)
    model.set_weights(initial_weights)
    model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(0.05, momentum=0.9))
    model.fit(features, targets, batch_size=batch_size, epochs=EPOCHS, shuffle=False, verbose=0)
    return model.get_weights()


# ----------------------------------------------------------------------------- fit


def _fit_trains_like_the_whole_batch_and_averages_the_loss(passes):
    """float64: N ranks x batch b give the weights of one process with batch N*b; with
    backward_passes_per_step=2 (gradients summed locally, averaged) those of batch 2*N*b.
    MetricAverageCallback hands later callbacks (History) the mean of the ranks' losses."""
    tf, hvd = _started()
    from hvdtrain.tensorflow import allgather_object

    n, r = hvd.size(), hvd.rank()
    features, targets = _data(n)
    initial = _model(tf, 0).get_weights()

    class LocalLogs(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.losses = []

        def on_epoch_end(self, epoch, logs=None):
            self.losses.append(logs["loss"])

    model = _model(tf, 0)
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9),
                                         backward_passes_per_step=passes, average_aggregated_gradients=True)
    model.compile(loss="mse", optimizer=optimizer)
    local = LocalLogs()
    rows = _rows_of_rank(n, r, len(features) // (n * BATCH))
    history = model.fit(features[rows], targets[rows], batch_size=BATCH, epochs=EPOCHS, shuffle=False,
                        verbose=0, callbacks=[local, hvd.callbacks.MetricAverageCallback()])
    reference = _fit_alone(tf, features, targets, n * BATCH * passes, initial)
    for got, want in zip(model.get_weights(), reference):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13, err_msg=f"passes={passes}")
    every_rank = allgather_object(local.losses)
    np.testing.assert_allclose(history.history["loss"], np.mean(every_rank, axis=0), rtol=1e-12)
    assert len({tuple(losses) for losses in every_rank}) == n  # each rank's own losses differ
    if passes == 1:
        assert optimizer._agg_helper is None
    else:  # Horovod's users read the passes counted since the last reduction
        assert int(optimizer._agg_helper.counter.numpy()) in range(passes)
    hvd.shutdown()


def fit_with_one_pass_a_step_trains_like_the_whole_batch_and_averages_the_loss():
    _fit_trains_like_the_whole_batch_and_averages_the_loss(1)


def fit_with_two_passes_a_step_trains_like_the_batch_of_both_and_averages_the_loss():
    _fit_trains_like_the_whole_batch_and_averages_the_loss(2)


# ----------------------------------------------------------------------------- callbacks


def the_broadcast_callback_trains_every_rank_in_lockstep_from_rank_0s_weights():
    """Ranks that start from different weights train in lockstep from rank 0's after
    BroadcastGlobalVariablesCallback: equal everywhere, and equal to one process started
    from rank 0's weights."""
    tf, hvd = _started()
    from hvdtrain.tensorflow import allgather_object, broadcast_object

    n, r = hvd.size(), hvd.rank()
    features, targets = _data(n)
    model = _model(tf, 100 + r)
    root_initial = broadcast_object(model.get_weights(), root_rank=0)
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9)))
    rows = _rows_of_rank(n, r, len(features) // (n * BATCH))
    model.fit(features[rows], targets[rows], batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    weights = model.get_weights()
    for other in allgather_object(weights):
        for mine, theirs in zip(weights, other):
            np.testing.assert_array_equal(mine, theirs)
    for got, want in zip(weights, _fit_alone(tf, features, targets, n * BATCH, root_initial)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)
    hvd.shutdown()


def broadcast_global_variables_gives_every_rank_the_roots_model_and_needs_the_model():
    tf, hvd = _started()
    from hvdtrain.tensorflow import allgather_object

    model = _model(tf, 200 + hvd.rank())
    assert not np.array_equal(*allgather_object(model.get_weights()[0])[:2])
    hvd.broadcast_global_variables(0, model=model)
    for weights_of_rank in allgather_object(model.get_weights()):
        for got, want in zip(weights_of_rank, model.get_weights()):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(RuntimeError, match="needs the model"):
        hvd.broadcast_global_variables(0)
    hvd.shutdown()


def the_warmup_callback_sets_horovods_learning_rate_and_momentum_before_every_batch():
    """LearningRateWarmupCallback sets, before batch b of epoch e < warmup_epochs,
    lr = initial_lr / size * ((e + (b + 1) / steps) * (size - 1) / warmup_epochs + 1), then
    stays at initial_lr; with tf-keras's legacy SGD it also corrects the momentum for the
    batch after each change and restores it."""
    tf, hvd = _started()
    n = hvd.size()
    legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
    features, targets = _data(n)
    steps, warmup_epochs, initial_lr = 4, 2, 0.04 * n
    seen = []

    class Recorder(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            optimizer = self.model.optimizer
            momentum = float(np.asarray(optimizer.momentum))
            seen.append((float(np.asarray(optimizer.learning_rate)), momentum))

    sgd = tf.keras.optimizers.legacy.SGD if legacy else tf.keras.optimizers.SGD
    model = _model(tf, 0)
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(sgd(initial_lr, momentum=0.5)))
    callbacks = [hvd.callbacks.LearningRateWarmupCallback(initial_lr, warmup_epochs=warmup_epochs,
                                                          momentum_correction=legacy),
                 Recorder()]
    history = model.fit(features[:steps * BATCH], targets[:steps * BATCH], batch_size=BATCH, epochs=3,
                        shuffle=False, verbose=0, callbacks=callbacks)
    expected, previous = [], initial_lr
    for epoch in range(3):
        for batch in range(steps):
            lr = (initial_lr / n * ((epoch + (batch + 1) / steps) * (n - 1) / warmup_epochs + 1)
                  if epoch < warmup_epochs else initial_lr)
            corrected = legacy and epoch < warmup_epochs
            expected.append((lr, 0.5 * lr / previous if corrected else 0.5))
            previous = lr
    np.testing.assert_allclose(seen, expected, rtol=1e-6)
    np.testing.assert_allclose(history.history["lr"], [initial_lr / n * ((e + 1) * (n - 1) / 2 + 1) for e in (0, 1)]
                               + [initial_lr], rtol=1e-6)
    assert float(np.asarray(model.optimizer.momentum)) == 0.5  # restored after the last correction
    hvd.shutdown()


def best_model_checkpoint_writes_from_rank_0_only():
    tf, hvd = _started()
    from hvdtrain.tensorflow import allgather_object

    n, r = hvd.size(), hvd.rank()
    directory = _shared_folder(hvd)
    features, targets = _data(n)
    model = _model(tf, 0)
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05)))
    checkpoint = hvd.callbacks.BestModelCheckpoint(monitor="val_loss", save_weights_only=True,
                                                   filepath=os.path.join(directory, f"rank{r}.weights.h5"))
    model.fit(features, targets, batch_size=BATCH, epochs=1, verbose=0, validation_data=(features, targets),
              callbacks=[checkpoint])
    allgather_object(None)  # every rank has finished writing
    assert sorted(os.listdir(directory)) == ["rank0.weights.h5"]
    _remove_once_all_are_done(hvd, directory)
    hvd.shutdown()


# ----------------------------------------------------------------------------- layers, loading


def sync_batch_normalization_normalizes_over_the_global_batch():
    """On N ranks x batch b like BatchNormalization on the global batch N*b, and updates the
    moving statistics alike."""
    tf, hvd = _started()
    from hvdtrain.tensorflow import SyncBatchNormalization

    n, r = hvd.size(), hvd.rank()
    inputs = np.random.default_rng(5).normal(size=(n * 6, 3)) * 3 + 1
    synced, alone = SyncBatchNormalization(), tf.keras.layers.BatchNormalization()
    mine = synced(tf.constant(inputs[r * 6:(r + 1) * 6]), training=True)
    everything = alone(tf.constant(inputs), training=True)
    np.testing.assert_allclose(mine, np.asarray(everything)[r * 6:(r + 1) * 6], rtol=1e-9, atol=1e-12)
    for got, want in zip(synced.get_weights(), alone.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    hvd.shutdown()


def a_model_loaded_with_load_model_trains_on_as_if_never_stopped():
    """A model saved after one epoch and loaded with hvd.load_model trains the second epoch as if
    never stopped: its weights end as those of one process with the whole batch for both epochs,
    which needs the momentum restored and the gradients averaged over the ranks again. Keras 3
    loads the legacy .h5 format into a model it cannot train (a Keras limitation), so .keras.
    A model saved without an optimizer is refused."""
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    directory = _shared_folder(hvd)
    features, targets = _data(n)
    rows = _rows_of_rank(n, r, len(features) // (n * BATCH))
    model = _model(tf, 0)
    initial = model.get_weights()
    # Not loss="mse": Keras 3 saves that string in a form it cannot load back.
    model.compile(loss=tf.keras.losses.MeanSquaredError(),
                  optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9)))
    model.fit(features[rows], targets[rows], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    path = os.path.join(directory, f"rank{r}.keras")
    model.save(path)
    resumed = hvd.load_model(path)
    assert type(resumed.optimizer).__name__ == "SGD" and resumed.optimizer._hvdtrain.reduction
    assert int(resumed.optimizer.iterations.numpy()) == len(rows) // BATCH
    resumed.fit(features[rows], targets[rows], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(resumed.get_weights(), _fit_alone(tf, features, targets, n * BATCH, initial)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)

    tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(1)]).save(path)  # not compiled
    with pytest.raises(ValueError, match=r"rank\d\.keras holds a model saved without an optimizer"):
        hvd.load_model(path)
    _remove_once_all_are_done(hvd, directory)
    hvd.shutdown()


def what_horovod_rejects_and_hvdtrain_cannot_do_is_refused_clearly():
    tf, hvd = _started()
    import hvdtrain.tensorflow as hvd_tf

    sgd = tf.keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="only supports Average and Sum"):
        hvd.DistributedOptimizer(sgd, op=hvd_tf.Min)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd_tf.DistributedGradientTape(tf.GradientTape(), op=hvd_tf.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="groups"):
        hvd_tf.DistributedGradientTape(tf.GradientTape(), groups=-1)
    with pytest.raises(ValueError, match="only supports Average and Sum"):  # Horovod's Keras has no Adasum
        hvd.DistributedOptimizer(sgd, op=hvd_tf.Adasum)
    tf1_sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)  # TF1 optimizers get Horovod's TF1 wrapper
    assert isinstance(hvd_tf.DistributedOptimizer(tf1_sgd), tf.compat.v1.train.Optimizer)
    with pytest.raises(ValueError, match="backward_passes_per_step > 1 is not yet supported .* eager execution"):
        hvd_tf.DistributedOptimizer(tf1_sgd, backward_passes_per_step=2)
    wrapped = hvd_tf.DistributedOptimizer(sgd)  # Keras optimizers go to hvdtrain.keras
    assert isinstance(wrapped, type(sgd)) and type(wrapped).__name__ == "SGD" and wrapped._hvdtrain.reduction
    with pytest.raises(ValueError, match="filepath"):
        hvd.callbacks.BestModelCheckpoint()
    logs = {"loss": 1.0} if hvd.rank() == 0 else {"loss": 1.0, "extra": 2.0}
    with pytest.raises(ValueError, match="every rank must log the same metrics"):
        hvd.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    hvd.shutdown()


# ----------------------------------------------------------------------------- tf-keras's compute path


def _compute_path_trains_like_the_whole_batch(path):
    """tf-keras (Keras 3 optimizers have no compute path): minimize(), or Horovod's
    _compute_gradients() then apply_gradients() in a tf.function, with backward_passes_per_step
    2 and an embedding's sparse gradient made dense, reach the weights of one process with the
    whole batch; _compute_gradients() returns the reduced gradients, equal on every rank."""
    tf, hvd = _started()
    from hvdtrain.tensorflow import allgather_object

    n, r = hvd.size(), hvd.rank()
    rng = np.random.default_rng(11)
    rows_total = 4 * n * BATCH
    data = rng.normal(size=(rows_total, 3)), rng.integers(0, 6, rows_total), rng.normal(size=(rows_total, 1))
    initial = [rng.normal(size=(3, 1)), rng.normal(size=(6, 1))]

    def batch(rows):
        return [tf.constant(a[rows]) for a in data]

    def loss(variables, x, i, y):
        return tf.reduce_mean((x @ variables[0] + tf.gather(variables[1], i) - y) ** 2)

    alone = [tf.Variable(w) for w in initial]
    for step in range(2):  # one update per 2 passes over the n ranks' batches
        with tf.GradientTape() as tape:
            value = loss(alone, *batch(slice(step * 2 * n * BATCH, (step + 1) * 2 * n * BATCH)))
        for variable, gradient in zip(alone, tape.gradient(value, alone)):
            variable.assign_sub(0.1 * tf.convert_to_tensor(gradient))

    variables = [tf.Variable(w) for w in initial]
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                         average_aggregated_gradients=True, sparse_as_dense=True)

    @tf.function
    def compute_and_apply(x, i, y):
        with tf.GradientTape() as tape:
            value = loss(variables, x, i, y)
        grads_and_vars = optimizer._compute_gradients(value, variables, tape=tape)
        optimizer.apply_gradients(grads_and_vars)
        return [g for g, _ in grads_and_vars]

    for p in range(4):
        x, i, y = batch(slice((p * n + r) * BATCH, (p * n + r + 1) * BATCH))
        if path == "minimize":
            optimizer.minimize(lambda: loss(variables, x, i, y), variables)
        else:
            gradients = [g.numpy() for g in compute_and_apply(x, i, y)]
            if p % 2:  # a pass that reduced: the same gradients everywhere
                for other in allgather_object(gradients):
                    for mine, theirs in zip(gradients, other):
                        np.testing.assert_array_equal(mine, theirs)
    assert int(optimizer.iterations.numpy()) == 4
    for got, want in zip(variables, alone):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, err_msg=path)
    hvd.shutdown()


def minimize_trains_like_the_whole_batch():
    _compute_path_trains_like_the_whole_batch("minimize")


def compute_gradients_returns_reduced_gradients_and_trains_like_the_whole_batch():
    _compute_path_trains_like_the_whole_batch("_compute_gradients")


# ----------------------------------------------------------------------------- local variables


def _one_of(variable, variables):
    return any(variable is v for v in variables)


def _two_layers(tf, value, trainable=True):
    initializer = tf.keras.initializers.Constant(value)
    model = tf.keras.Sequential([tf.keras.Input((2,))] + [
        tf.keras.layers.Dense(2, kernel_initializer=initializer, bias_initializer=initializer,
                              trainable=trainable) for _ in range(2)])
    return model, model.layers[0].trainable_weights, model.layers[1].trainable_weights


def _local_gradients_stay_each_ranks_own(make):
    """Gradients of local variables stay each rank's own, divided by the size (Horovod's
    scale_local_gradients) unless scale_local_gradients=False; the others are averaged."""
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    mean = (n + 1) / 2  # of the ranks' gradients r + 1
    model, local, shared = _two_layers(tf, 0.0)
    sgd = tf.keras.optimizers.SGD(1.0)
    if make == "PartialDistributedOptimizer":
        optimizer = hvd.PartialDistributedOptimizer(sgd, local_layers=model.layers[0])
    else:
        optimizer = hvd.DistributedOptimizer(sgd, scale_local_gradients=make == "register_local_var")
        for variable in local:
            optimizer.register_local_var(variable)
    optimizer.apply_gradients([(tf.ones_like(v) * (r + 1), v) for v in local + shared])
    own = (r + 1) / n if make != "scale_local_gradients=False" else r + 1
    for variable in local + shared:
        np.testing.assert_allclose(variable.numpy(), -own if _one_of(variable, local) else -mean, err_msg=make)
    hvd.shutdown()


def partial_distributed_optimizer_keeps_the_local_layers_gradients():
    _local_gradients_stay_each_ranks_own("PartialDistributedOptimizer")


def register_local_var_keeps_that_variables_gradient():
    _local_gradients_stay_each_ranks_own("register_local_var")


def local_gradients_are_not_divided_with_scale_local_gradients_false():
    _local_gradients_stay_each_ranks_own("scale_local_gradients=False")


def partial_distributed_gradient_tape_keeps_the_local_layers_gradients():
    """Weights and inputs of ones: h = 3, d loss/d b1 = r + 1, d W1 = 3 (r + 1), d b0 = d W0 = 2 (r + 1)."""
    tf, hvd = _started()
    import hvdtrain.tensorflow as hvd_tf

    n, r = hvd.size(), hvd.rank()
    mean = (n + 1) / 2
    model, local, shared = _two_layers(tf, 1.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.ones((1, 2)))) * (r + 1)
    tape = hvd_tf.PartialDistributedGradientTape(tape, local_layers=[model.layers[0]])
    local_pairs, shared_pairs = tape.get_local_and_global_gradients(loss, local + shared)
    assert all(v is w for (v, _), w in zip(local_pairs + shared_pairs, local + shared))
    for (_, gradient), want in zip(local_pairs + shared_pairs, [2 * (r + 1) / n] * 2 + [3 * mean, mean]):
        np.testing.assert_allclose(gradient, np.full(gradient.shape, want))
    hvd.shutdown()


def the_broadcast_callback_leaves_local_variables_at_each_ranks_values():
    """BroadcastGlobalVariablesCallback(local_variables=...); and what is not a tf.Variable is refused."""
    tf, hvd = _started()
    n, r = hvd.size(), hvd.rank()
    model, local, shared = _two_layers(tf, float(r), trainable=False)
    root = n - 1
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)))
    local_variables = model.layers[0].variables
    model.fit(np.ones((2, 2)), np.ones((2, 2)), batch_size=2, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(root, local_variables=local_variables)])
    for variable in model.variables:
        np.testing.assert_array_equal(variable.numpy(), r if _one_of(variable, local_variables) else root)
    with pytest.raises(ValueError, match="local variables must be of tf.Variable type"):
        hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[np.zeros(2)])
    hvd.shutdown()


# ----------------------------------------------------------------------------- the jobs

CHECKS = [fit_with_one_pass_a_step_trains_like_the_whole_batch_and_averages_the_loss,
          fit_with_two_passes_a_step_trains_like_the_batch_of_both_and_averages_the_loss,
          the_broadcast_callback_trains_every_rank_in_lockstep_from_rank_0s_weights,
          broadcast_global_variables_gives_every_rank_the_roots_model_and_needs_the_model,
          the_warmup_callback_sets_horovods_learning_rate_and_momentum_before_every_batch,
          best_model_checkpoint_writes_from_rank_0_only, sync_batch_normalization_normalizes_over_the_global_batch,
          a_model_loaded_with_load_model_trains_on_as_if_never_stopped,
          what_horovod_rejects_and_hvdtrain_cannot_do_is_refused_clearly,
          partial_distributed_optimizer_keeps_the_local_layers_gradients,
          register_local_var_keeps_that_variables_gradient,
          local_gradients_are_not_divided_with_scale_local_gradients_false,
          partial_distributed_gradient_tape_keeps_the_local_layers_gradients,
          the_broadcast_callback_leaves_local_variables_at_each_ranks_values]
# Keras 3 optimizers have no compute path.
TF_KERAS_ONLY = [minimize_trains_like_the_whole_batch,
                 compute_gradients_returns_reduced_gradients_and_trains_like_the_whole_batch]


def job(ranks, keras):
    env = {"TF_CPP_MIN_LOG_LEVEL": "1", "TF_USE_LEGACY_KERAS": "1" if keras == "tf-keras" else "0"}
    return ranks.run(2, CHECKS + (TF_KERAS_ONLY if keras == "tf-keras" else []), env=env, timeout=300)


@pytest.mark.parametrize("keras", ["keras3", "tf-keras"])
@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_keras_on_two_ranks(ranks, check, keras):
    job(ranks, keras).assert_passed(check)


@pytest.mark.parametrize("check", TF_KERAS_ONLY, ids=lambda check: check.__name__)
def test_tf_keras_compute_path_on_two_ranks(ranks, check):
    job(ranks, "tf-keras").assert_passed(check)
