"""Training with recipe.framework=tensorflow on real ranks (hvdtrain/training/train_tensorflow.py):
the digits recipe reaches its target, writes every run-directory file, checkpoints its weights,
momentum buffers and LR, and reports the figures PyTorch's loop does; a run killed after a
checkpoint and resumed ends with the same weights, bit for bit, as an uninterrupted one; an
ImageFolder recipe with 2 backward passes; and, on 2 ranks, the loop keeps torch's semantics: its
optimizer is PyTorch's SGD, gradients are averaged over ranks and passes, validation sums are
exact, ImageFolder data is torchvision's."""

import functools
import io

import numpy as np
import pytest

from hvdtrain.reporting.report import throughput
from hvdtrain.reporting.run_log import read_history

from support.commands import assert_the_figures_divide, crash_and_resume, history, newest_checkpoint, results_of, \
    run_hvdtrain

from parallel.runs import TIMEOUT

TENSORFLOW = "recipe.framework=tensorflow"


def read_arrays(data):
    """A checkpoint's TensorFlow state as the arrays it holds, read as the loop reads them: no pickles."""
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {"arrays": {name: archive[name] for name in archive.files}}


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """`hvdtrain recipe.framework=tensorflow`: the digits recipe on 2 local ranks, to the end."""
    run_dir = tmp_path_factory.mktemp("digits") / "run"
    result = run_hvdtrain(TENSORFLOW, f"hydra.run.dir={run_dir}", timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir, result


def test_the_digits_recipe_trains_with_tensorflow_on_two_local_ranks(digits_run):
    run_dir, result = digits_run
    results = results_of(run_dir)
    assert results["recipe"] == "digits" and results["framework"] == "tensorflow"
    assert (results["world_size"], results["global_batch_size"], results["epochs_completed"]) == (2, 64, 12)
    assert "hvdtrain: recipe digits (tensorflow)" in result.stdout


def test_the_digits_recipe_reaches_its_target_with_tensorflow(digits_run):
    results = results_of(digits_run[0])
    assert results["metrics"]["val_top1"] >= 95.0 and results["target_reached"] is True


def test_every_validation_image_is_counted_once(digits_run):
    assert round(results_of(digits_run[0])["metrics"]["val_top1"] * 360 / 100, 6).is_integer()


@pytest.mark.parametrize("name", ["config.yaml", "metrics.jsonl", "report.md", "loss.png", "accuracy.png", "lr.png"])
def test_a_tensorflow_run_leaves_its_files(digits_run, name):
    assert (digits_run[0] / name).is_file()


def test_a_tensorflow_run_leaves_tensorboard_events(digits_run):
    assert list((digits_run[0] / "tensorboard").glob("events.out.tfevents.*"))


def test_every_record_has_the_step_epoch_lr_and_loss(digits_run):
    assert all({"step", "epoch", "lr", "loss"} <= set(r) for r in read_history(digits_run[0] / "metrics.jsonl"))


def test_a_tensorflow_run_evaluates_at_every_epochs_end(digits_run):
    records = read_history(digits_run[0] / "metrics.jsonl")
    assert [r["epoch"] for r in records if r["event"] == "eval"] == list(range(1, 13))


def test_a_tensorflow_run_checkpoints_every_20_steps_and_at_epoch_ends_keeping_3(digits_run):
    assert sorted(p.name for p in (digits_run[0] / "checkpoints").iterdir()) == [
        "step-000000242.ckpt", "step-000000260.ckpt", "step-000000264.ckpt"]


def test_the_newest_checkpoint_is_of_the_last_step(digits_run):
    state = newest_checkpoint(digits_run[0], read_arrays)
    assert (state["epoch"], state["step"], state["global_step"], state["world_size"]) == (12, 0, 264, 2)


def test_a_checkpoint_holds_the_weights_momentum_buffers_and_lr(digits_run):
    arrays = newest_checkpoint(digits_run[0], read_arrays)["arrays"]
    assert {"model/digits_mlp/hidden/kernel", "momentum/digits_mlp/hidden/kernel", "lr"} <= set(arrays)


def test_tensorflow_reports_the_figures_as_torch_does(digits_run):
    run_dir, result = digits_run
    results = results_of(run_dir)
    assert (results["epochs_completed"], results["epochs"]) == (12, 12)
    assert_the_figures_divide(results, samples_trained=264 * 64)


def test_the_summary_prints_the_throughput_figures(digits_run):
    run_dir, result = digits_run
    assert f"hvdtrain: digits finished 12 of 12 epochs on 2 ranks: {throughput(results_of(run_dir))}" in result.stdout


@pytest.fixture(scope="module")
def crashed_and_resumed(tmp_path_factory, digits_run):
    """The digits recipe with tensorflow killed after two checkpoints, its newest cut short, and
    resumed to the end: (its newest checkpoint, the uninterrupted run's, its run directory)."""
    run_dir = tmp_path_factory.mktemp("crashed") / "run"
    crash_and_resume(run_dir, TENSORFLOW, timeout=TIMEOUT)
    return newest_checkpoint(run_dir, read_arrays), newest_checkpoint(digits_run[0], read_arrays), run_dir


def test_a_killed_tensorflow_run_resumes_to_the_last_step(crashed_and_resumed):
    resumed, _, _ = crashed_and_resumed
    assert resumed["global_step"] == 264


def test_a_killed_tensorflow_run_resumes_to_the_same_weights(crashed_and_resumed):
    resumed, expected, _ = crashed_and_resumed
    assert set(resumed["arrays"]) == set(expected["arrays"])
    for name, array in expected["arrays"].items():  # weights, BatchNorm statistics, momentum buffers, LR: bit for bit
        assert np.array_equal(resumed["arrays"][name], array), name


def test_a_killed_tensorflow_run_resumes_to_the_same_history(crashed_and_resumed, digits_run):
    _, _, run_dir = crashed_and_resumed
    assert history(run_dir) == history(digits_run[0])


def test_a_killed_tensorflow_run_resumes_to_the_same_metrics(crashed_and_resumed, digits_run):
    _, _, run_dir = crashed_and_resumed
    assert results_of(run_dir)["metrics"] == results_of(digits_run[0])["metrics"]


@pytest.fixture(scope="module")
def imagefolder_run(tmp_path_factory, image_tree):
    """ResNet-50 as Goyal et al. train it (BatchNorm, zero-initialized residual gammas, no weight
    decay on BN) on the tiny tree, with 2 backward passes per step: its run directory."""
    run_dir = tmp_path_factory.mktemp("imagefolder") / "run"
    result = run_hvdtrain("recipe=resnet50_imagenet", "cluster=local", TENSORFLOW, f"data.root={image_tree}",
                          "model.num_classes=3", "data.image_size=32", "data.resize_size=36", "data.loader_workers=1",
                          "train.batch_size=2", "train.backward_passes_per_step=2", "train.epochs=1",
                          "schedule.warmup_epochs=1", f"hydra.run.dir={run_dir}", timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir


def test_an_imagefolder_recipe_trains_with_tensorflow(imagefolder_run):
    results = results_of(imagefolder_run)
    assert (results["framework"], results["world_size"], results["global_batch_size"]) == ("tensorflow", 2, 8)


def test_an_imagefolder_runs_validation_counts_every_image_once(imagefolder_run):
    assert round(results_of(imagefolder_run)["metrics"]["val_top1"] * 9 / 100, 6).is_integer()  # 9 images


def test_an_imagefolder_run_checkpoints_at_its_epochs_end(imagefolder_run):
    assert sorted(p.name for p in (imagefolder_run / "checkpoints").iterdir()) == ["step-000000003.ckpt"]  # 24//2//4


def test_an_imagefolder_runs_checkpoint_holds_all_of_resnet50(imagefolder_run):
    arrays = newest_checkpoint(imagefolder_run, read_arrays)["arrays"]
    weights, buffers = ([name for name in arrays if name.startswith(part)] for part in ("model/", "momentum/"))
    assert (len(weights), len(buffers)) == (320, 214)  # all of ResNet-50's weights and BN statistics, all buffers


# The loop's semantics, checked on 2 ranks in one job. Every check takes the job's one argument,
# the image tree, which only the ImageFolder checks read. Only the checks that reduce over the
# ranks start the engine: a rank that has done its last collective check may end before the
# other has done its checks, which stops the other's engine, and starting it again there would
# wait for a rank that has gone.

def frameworks():
    """torch, torchvision, keras, tensorflow and hvdtrain.tensorflow, imported in the order that
    works (torchvision imported after TensorFlow crashes the process)."""
    import torch  # noqa: I001
    import torchvision
    import keras
    import tensorflow as tf

    import hvdtrain.tensorflow as hvd

    keras.utils.set_random_seed(0)
    return torch, torchvision, keras, tf, hvd


def collective_frameworks():
    """frameworks(), with hvdtrain.tensorflow initialized."""
    torch, torchvision, keras, tf, hvd = frameworks()
    hvd.init()
    return torch, torchvision, keras, tf, hvd


def updates_as_torchs_sgd(nesterov, correction, excluded):
    """The loop's SGD and torch.optim.SGD from the same weights over 5 steps of the same
    gradients, with LR changes: their weights agree."""
    torch, _, _, tf, _ = collective_frameworks()
    from hvdtrain.run.config import typed
    from hvdtrain.tasks.models_tensorflow import build_model
    from hvdtrain.tasks.models_torch import build_model as build_torch_model
    from hvdtrain.training.train_tensorflow import SGD, _update
    from hvdtrain.training.train_torch import _parameter_groups, _set_learning_rate

    cfg = typed({"model": {"name": "digits_cnn", "num_classes": 10},
                 "optimizer": {"momentum": 0.9, "nesterov": nesterov, "weight_decay": 0.01,
                               "momentum_correction": correction, "exclude_from_weight_decay": excluded}})
    model = build_model(cfg.model, 8)
    optimizer = SGD(model, cfg.optimizer, 0.1)
    torch_model = build_torch_model(cfg.model)
    layouts = [(3, 2, 0, 1) if v.ndim == 4 else (1, 0) if v.ndim == 2 else (0,) for v in model.trainable_variables]
    with torch.no_grad():
        for p, v, layout in zip(torch_model.parameters(), model.trainable_variables, layouts, strict=True):
            p.copy_(torch.from_numpy(np.transpose(v.numpy(), layout)))
    torch_optimizer = torch.optim.SGD(_parameter_groups(torch_model, cfg.optimizer), lr=0.1, momentum=0.9,
                                      nesterov=nesterov, weight_decay=0.01)
    generator = np.random.default_rng(1)  # the same gradients on every rank: their average is themselves
    for lr in (0.1, 0.1, 0.05, 0.2, 0.2):
        gradients = [generator.standard_normal(v.shape).astype(np.float32) for v in model.trainable_variables]
        optimizer.set_learning_rate(lr)
        _update(optimizer, [tf.constant(g) for g in gradients], tf.constant(lr, tf.float32))
        _set_learning_rate(torch_optimizer, lr, correction)
        for p, g, layout in zip(torch_model.parameters(), gradients, layouts):
            p.grad = torch.from_numpy(np.ascontiguousarray(np.transpose(g, layout)))
        torch_optimizer.step()
    for p, v, layout in zip(torch_model.parameters(), model.trainable_variables, layouts):
        np.testing.assert_allclose(np.transpose(v.numpy(), layout), p.detach().numpy(), rtol=1e-5, atol=1e-6)


def the_update_is_torchs_nesterov_sgd_with_coupled_weight_decay_not_on_bn_or_biases(image_root):
    updates_as_torchs_sgd(nesterov=True, correction=False, excluded=["bn", "bias"])


def the_update_is_torchs_sgd_with_momentum_correction_on_lr_changes(image_root):
    updates_as_torchs_sgd(nesterov=False, correction=True, excluded=[])


def zero_init_residual_zeroes_the_last_batchnorm_of_each_residual_block_only(image_root):
    _, _, keras, _, _ = frameworks()
    from hvdtrain.run.config import typed
    from hvdtrain.tasks.models_tensorflow import build_model

    resnet = build_model(typed({"model": {"name": "resnet50", "zero_init_residual": True}}).model, 32)
    gammas = {layer.name: layer.gamma.numpy() for layer in resnet.layers
              if isinstance(layer, keras.layers.BatchNormalization)}
    last = {name for name in gammas if name.endswith("_3_bn")}
    assert len(last) == 16 and not any(gammas[name].any() for name in last)
    assert all(gammas[name].all() for name in gammas.keys() - last)


def a_step_of_the_ranks_passes_is_one_step_on_all_their_samples_at_once(image_root):
    """One step of N ranks x 2 backward passes x 2 samples is one step on all 4N samples at once."""
    _, _, _, tf, hvd = collective_frameworks()
    from hvdtrain.run.config import typed
    from hvdtrain.tasks.models_tensorflow import build_model
    from hvdtrain.training.train_tensorflow import SGD, _train_step

    rank, size = hvd.rank(), hvd.size()
    cfg = typed({"model": {"name": "digits_mlp", "num_classes": 10}, "optimizer": {"weight_decay": 0.01}})
    model, reference = build_model(cfg.model, 8), build_model(cfg.model, 8)
    hvd.broadcast_variables(model.weights, root_rank=0)
    reference.set_weights(model.get_weights())
    generator = np.random.default_rng(2)
    images = generator.random((4 * size, 8, 8, 1), dtype=np.float32)
    labels = generator.integers(10, size=4 * size)
    mine = [(tf.constant(images[i:i + 2]), tf.constant(labels[i:i + 2])) for i in (4 * rank, 4 * rank + 2)]
    _train_step(model, SGD(model, cfg.optimizer, 0.1), iter(mine), passes=2)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=reference(images)))
    SGD(reference, cfg.optimizer, 0.1).apply(tape.gradient(loss, reference.trainable_variables), 0.1)
    for trained, expected in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(trained, expected, rtol=1e-5, atol=1e-7)


@functools.cache
def evaluated():
    """(the metrics train_tensorflow.evaluate reduces over the ranks, the model it evaluated, the
    validation set, the number of ranks): digits_cnn, its BatchNorm moving means set to each
    rank's number, as if every rank had seen other data. Evaluated once a job, for all the
    checks that read it."""
    _, _, keras, _, hvd = collective_frameworks()
    from hvdtrain.run.config import typed
    from hvdtrain.tasks.data_tensorflow import build_datasets
    from hvdtrain.tasks.models_tensorflow import build_model
    from hvdtrain.training.train_tensorflow import evaluate

    cfg = typed({"model": {"name": "digits_cnn", "num_classes": 10}, "data": {"source": "digits", "val_size": 360},
                 "train": {"batch_size": 7}})
    model = build_model(cfg.model, 8)
    hvd.broadcast_variables(model.weights, root_rank=0)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.moving_mean.assign(np.full(layer.moving_mean.shape, hvd.rank(), np.float32))
    _, val = build_datasets(cfg.data, 10, 0)
    return evaluate(model, val, cfg), model, val, hvd.size()


def the_batchnorm_statistics_are_averaged_over_the_ranks(image_root):
    _, _, keras, _, _ = frameworks()
    _, model, _, size = evaluated()
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            assert np.all(layer.moving_mean.numpy() == (size - 1) / 2)


def the_top1_accuracy_is_exact(image_root):
    metrics, model, val, _ = evaluated()
    logits = model(val.images, training=False).numpy()  # the same model over the whole set, in this process
    correct = int(np.sum(logits.argmax(axis=1) == val.labels))
    assert metrics["val_top1"] == 100.0 * correct / 360, (metrics, correct)


def the_top5_accuracy_is_exact(image_root):
    metrics, model, val, _ = evaluated()
    logits = model(val.images, training=False).numpy()
    in_top5 = int(np.sum(np.any(np.argsort(-logits, axis=1)[:, :5] == val.labels[:, None], axis=1)))
    assert metrics["val_top5"] == 100.0 * in_top5 / 360


def the_loss_is_the_whole_sets(image_root):
    _, _, _, tf, _ = frameworks()
    metrics, model, val, _ = evaluated()
    logits = model(val.images, training=False).numpy()
    expected_loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=val.labels, logits=logits))
    assert metrics["val_loss"] == pytest.approx(float(expected_loss), rel=1e-5)


@functools.cache
def image_folder(image_root):
    """The tiny tree as the tensorflow data takes it: (train, val)."""
    frameworks()
    from hvdtrain.run.config import typed
    from hvdtrain.tasks.data_tensorflow import build_datasets

    cfg = typed({"data": {"source": "imagefolder", "root": image_root, "image_size": 10, "resize_size": 12},
                 "model": {"num_classes": 3}})
    return build_datasets(cfg.data, 3, 0)


def an_image_folder_has_torchvisions_samples_at_torchvisions_indices(image_root):
    _, torchvision, _, _, _ = frameworks()
    train, val = image_folder(image_root)
    for split, data in (("train", train), ("val", val)):
        listed = torchvision.datasets.ImageFolder(f"{image_root}/{split}").samples
        assert [(str(path), int(label)) for path, label in zip(data.paths, data.labels)] == listed


def validation_images_are_normalized_with_imagenets_mean_and_std(image_root):
    from hvdtrain.tasks.data import IMAGENET_MEAN, IMAGENET_STD

    _, val = image_folder(image_root)
    images, labels = next(iter(val.batches([1, 7], 2)))
    assert images.shape == (2, 10, 10, 3) and labels.numpy().tolist() == [0, 2]  # blue, red
    blue = (np.array([35, 35, 205]) / 255 - IMAGENET_MEAN) / IMAGENET_STD  # the conftest's second blue image
    np.testing.assert_allclose(images[0].numpy(), np.broadcast_to(blue, (10, 10, 3)), rtol=1e-5)


def training_images_are_cropped_to_the_image_size(image_root):
    train, _ = image_folder(image_root)
    assert next(iter(train.batches([0, 5], 2, [11, 12])))[0].shape == (2, 10, 10, 3)


def the_random_crop_and_flip_depend_on_the_seed_alone(image_root):
    _, _, _, tf, _ = frameworks()
    from hvdtrain.tasks.data_tensorflow import _crop_and_flip

    picture = tf.constant(np.random.default_rng(3).integers(0, 256, (20, 16, 3), dtype=np.uint8))
    crops = [_crop_and_flip(picture, tf.constant(seed, tf.int64), 10).numpy() for seed in (11, 11, 12)]
    assert np.array_equal(crops[0], crops[1]) and not np.array_equal(crops[0], crops[2])


SEMANTICS = [
    the_update_is_torchs_nesterov_sgd_with_coupled_weight_decay_not_on_bn_or_biases,
    the_update_is_torchs_sgd_with_momentum_correction_on_lr_changes,
    zero_init_residual_zeroes_the_last_batchnorm_of_each_residual_block_only,
    a_step_of_the_ranks_passes_is_one_step_on_all_their_samples_at_once,
    the_batchnorm_statistics_are_averaged_over_the_ranks, the_top1_accuracy_is_exact, the_top5_accuracy_is_exact,
    the_loss_is_the_whole_sets,
    an_image_folder_has_torchvisions_samples_at_torchvisions_indices,
    validation_images_are_normalized_with_imagenets_mean_and_std, training_images_are_cropped_to_the_image_size,
    the_random_crop_and_flip_depend_on_the_seed_alone,
]


@pytest.mark.parametrize("check", SEMANTICS, ids=lambda check: check.__name__)
def test_the_loop_keeps_the_torch_semantics_on_two_ranks(ranks, image_tree, check):
    ranks.run(2, SEMANTICS, image_tree, timeout=TIMEOUT).assert_passed(check)
