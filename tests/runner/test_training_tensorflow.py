"""The runner with recipe.framework=tensorflow, each with real ranks: the digits recipe reaches its
target, writes every run-directory file and reports the figures PyTorch's loop does; a run killed
after a checkpoint and resumed ends with the same weights, bit for bit, as an uninterrupted one;
an ImageFolder recipe; the loop's optimizer is PyTorch's SGD, its gradients are averaged over ranks
and passes, its validation sums are exact; the synthetic benchmark; neither framework imports the other."""

import ast
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hvdtrain.reporting.run_log import read_history
from hvdtrain.launch import mpirun as launcher
from hvdtrain.reporting.report import throughput
from support.commands import assert_the_figures_divide, crash_and_resume, history, newest_checkpoint, results_of, run_hvdtrain

REPO = Path(__file__).resolve().parents[2]

TIMEOUT = 240
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


def test_the_digits_recipe_reaches_its_target_with_tensorflow(digits_run):
    run_dir, result = digits_run
    results = results_of(run_dir)
    assert results["recipe"] == "digits" and results["framework"] == "tensorflow"
    assert (results["world_size"], results["global_batch_size"], results["epochs_completed"]) == (2, 64, 12)
    assert results["metrics"]["val_top1"] >= 95.0 and results["target_reached"] is True
    assert round(results["metrics"]["val_top1"] * 360 / 100, 6).is_integer()  # every validation image counted once
    assert "hvdtrain: recipe digits (tensorflow)" in result.stdout
    for name in ("config.yaml", "metrics.jsonl", "report.md", "loss.png", "accuracy.png", "lr.png"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    records = read_history(run_dir / "metrics.jsonl")
    assert all({"step", "epoch", "lr", "loss"} <= set(r) for r in records)
    assert [r["epoch"] for r in records if r["event"] == "eval"] == list(range(1, 13))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "step-000000242.ckpt", "step-000000260.ckpt", "step-000000264.ckpt"]  # every 20 steps and epoch ends, last 3
    state = newest_checkpoint(run_dir, read_arrays)
    assert (state["epoch"], state["step"], state["global_step"], state["world_size"]) == (12, 0, 264, 2)
    assert {"model/digits_mlp/hidden/kernel", "momentum/digits_mlp/hidden/kernel", "lr"} <= set(state["arrays"])


def test_tensorflow_reports_the_figures_as_torch_does(digits_run):
    run_dir, result = digits_run
    results = results_of(run_dir)
    assert (results["epochs_completed"], results["epochs"]) == (12, 12)
    assert_the_figures_divide(results, samples_trained=264 * 64)
    assert f"hvdtrain: digits finished 12 of 12 epochs on 2 ranks: {throughput(results)}" in result.stdout


def test_a_killed_tensorflow_run_resumes_to_the_same_weights(digits_run, tmp_path):
    uninterrupted, _ = digits_run
    run_dir = tmp_path / "run"
    crash_and_resume(run_dir, TENSORFLOW, timeout=TIMEOUT)

    resumed, expected = newest_checkpoint(run_dir, read_arrays), newest_checkpoint(uninterrupted, read_arrays)
    assert resumed["global_step"] == 264
    assert set(resumed["arrays"]) == set(expected["arrays"])
    for name, array in expected["arrays"].items():  # weights, BatchNorm statistics, momentum buffers, LR: bit for bit
        assert np.array_equal(resumed["arrays"][name], array), name
    assert history(run_dir) == history(uninterrupted)
    assert results_of(run_dir)["metrics"] == results_of(uninterrupted)["metrics"]


def test_an_imagefolder_recipe_trains_with_tensorflow(image_tree, tmp_path):
    """ResNet-50 as Goyal et al. train it (BatchNorm, zero-initialized residual gammas, no weight
    decay on BN) on the tiny tree, with 2 backward passes per step."""
    run_dir = tmp_path / "run"
    result = run_hvdtrain("recipe=resnet50_imagenet", "cluster=local", TENSORFLOW, f"data.root={image_tree}",
                          "model.num_classes=3", "data.image_size=32", "data.resize_size=36", "data.loader_workers=1",
                          "train.batch_size=2", "train.backward_passes_per_step=2", "train.epochs=1",
                          "schedule.warmup_epochs=1", f"hydra.run.dir={run_dir}", timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    results = results_of(run_dir)
    assert (results["framework"], results["world_size"], results["global_batch_size"]) == ("tensorflow", 2, 8)
    assert round(results["metrics"]["val_top1"] * 9 / 100, 6).is_integer()  # 9 validation images, all counted
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000000003.ckpt"]  # 24 // 2 // 4
    arrays = newest_checkpoint(run_dir, read_arrays)["arrays"]
    weights, buffers = ([name for name in arrays if name.startswith(part)] for part in ("model/", "momentum/"))
    assert (len(weights), len(buffers)) == (320, 214)  # all of ResNet-50's weights and BN statistics, all buffers


def ranks_the_loop_keeps_the_torch_semantics(image_root):
    import torch  # noqa: I001 (torchvision imported after TensorFlow crashes the process)
    import torchvision
    import keras
    import tensorflow as tf

    import hvdtrain.tensorflow as hvd
    from hvdtrain.run.config import typed
    from hvdtrain.tasks.data import IMAGENET_MEAN, IMAGENET_STD
    from hvdtrain.tasks.data_tensorflow import _crop_and_flip, build_datasets
    from hvdtrain.tasks.models_tensorflow import build_model
    from hvdtrain.tasks.models_torch import build_model as build_torch_model
    from hvdtrain.training.train_tensorflow import SGD, _train_step, _update, evaluate
    from hvdtrain.training.train_torch import _parameter_groups, _set_learning_rate

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(0)

    # The update is torch.optim.SGD's, step for step: coupled weight decay (not on BN, not on
    # biases), Nesterov momentum, LR changes without momentum correction.
    for nesterov, correction, excluded in ((True, False, ["bn", "bias"]), (False, True, [])):
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

    # zero_init_residual: gamma = 0 in the last BN of each of ResNet-50's 16 residual blocks only.
    resnet = build_model(typed({"model": {"name": "resnet50", "zero_init_residual": True}}).model, 32)
    gammas = {layer.name: layer.gamma.numpy() for layer in resnet.layers
              if isinstance(layer, keras.layers.BatchNormalization)}
    last = {name for name in gammas if name.endswith("_3_bn")}
    assert len(last) == 16 and not any(gammas[name].any() for name in last)
    assert all(gammas[name].all() for name in gammas.keys() - last)

    # One step of N ranks x 2 backward passes x 2 samples is one step on all 4N samples at once.
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

    # Validation: BN statistics averaged over the ranks, then exact sums over the whole set.
    cfg = typed({"model": {"name": "digits_cnn", "num_classes": 10}, "data": {"source": "digits", "val_size": 360},
                 "train": {"batch_size": 7}})
    model = build_model(cfg.model, 8)
    hvd.broadcast_variables(model.weights, root_rank=0)
    for layer in model.layers:  # every rank saw different data: different moving statistics
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.moving_mean.assign(np.full(layer.moving_mean.shape, rank, np.float32))
    _, val = build_datasets(cfg.data, 10, 0)
    metrics = evaluate(model, val, cfg)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            assert np.all(layer.moving_mean.numpy() == (size - 1) / 2)
    logits = model(val.images, training=False).numpy()  # the same model over the whole set, in this process
    correct = int(np.sum(logits.argmax(axis=1) == val.labels))
    assert metrics["val_top1"] == 100.0 * correct / 360, (metrics, correct)
    in_top5 = int(np.sum(np.any(np.argsort(-logits, axis=1)[:, :5] == val.labels[:, None], axis=1)))
    assert metrics["val_top5"] == 100.0 * in_top5 / 360
    expected_loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=val.labels, logits=logits))
    assert metrics["val_loss"] == pytest.approx(float(expected_loss), rel=1e-5)

    # An ImageFolder tree: the same samples at the same indices as torchvision's ImageFolder,
    # normalized with ImageNet's mean and std; the random crop and flip depend on the seed alone.
    cfg = typed({"data": {"source": "imagefolder", "root": image_root, "image_size": 10, "resize_size": 12},
                 "model": {"num_classes": 3}})
    train, val = build_datasets(cfg.data, 3, 0)
    for split, data in (("train", train), ("val", val)):
        listed = torchvision.datasets.ImageFolder(f"{image_root}/{split}").samples
        assert [(str(path), int(label)) for path, label in zip(data.paths, data.labels)] == listed
    images, labels = next(iter(val.batches([1, 7], 2)))
    assert images.shape == (2, 10, 10, 3) and labels.numpy().tolist() == [0, 2]  # blue, red
    blue = (np.array([35, 35, 205]) / 255 - IMAGENET_MEAN) / IMAGENET_STD  # the conftest's second blue image
    np.testing.assert_allclose(images[0].numpy(), np.broadcast_to(blue, (10, 10, 3)), rtol=1e-5)
    assert next(iter(train.batches([0, 5], 2, [11, 12])))[0].shape == (2, 10, 10, 3)
    picture = tf.constant(np.random.default_rng(3).integers(0, 256, (20, 16, 3), dtype=np.uint8))
    crops = [_crop_and_flip(picture, tf.constant(seed, tf.int64), 10).numpy() for seed in (11, 11, 12)]
    assert np.array_equal(crops[0], crops[1]) and not np.array_equal(crops[0], crops[2])


def test_the_loop_keeps_the_torch_semantics(mpirun, image_tree):
    mpirun(2, ranks_the_loop_keeps_the_torch_semantics, image_tree, timeout=TIMEOUT)


def test_the_synthetic_benchmark_runs_with_tensorflow():
    environment = launcher.worker_environment(2)
    program = [sys.executable, "-u", str(REPO / "scripts" / "synthetic_benchmark.py"), "--framework", "tensorflow",
               "--model", "mobilenet_v3_small", "--no-cuda", "--batch-size", "2", "--num-warmup-batches", "1",
               "--num-batches-per-iter", "1", "--num-iters", "2"]
    result = launcher.run(launcher.mpirun_command(program, num_proc=2, env=environment), env=environment,
                          timeout=TIMEOUT, capture=True)
    assert result.returncode == 0, result.stdout
    lines = [line for line in result.stdout.splitlines()
             if line.startswith(("Model", "Number", "Iter", "Img", "Total"))]
    assert lines[:2] == ["Model: mobilenet_v3_small", "Number of CPUs: 2"]  # rank 0 alone reports
    assert [line.split(":")[0] for line in lines[2:]] == [
        "Iter #0", "Iter #1", "Img/sec per CPU", "Total img/sec on 2 CPU(s)"]
    per_cpu, total = (float(line.split(": ")[1].split(" ")[0]) for line in lines[-2:])
    assert per_cpu > 0 and total == pytest.approx(2 * per_cpu, abs=0.11)


@pytest.mark.parametrize("imports,absent", [
    ("import hvdtrain.launch.cli, hvdtrain.run.plan, hvdtrain.training.worker, hvdtrain.reporting.report, hvdtrain.reporting.run_log", ("torch", "tensorflow")),
    ("import hvdtrain.training.loop", ("torch", "tensorflow")),
    ("import hvdtrain.training.train_torch", ("tensorflow", "keras")),
    ("import hvdtrain.training.train_tensorflow", ("torch",)),
])
def test_each_loop_imports_only_its_framework(imports, absent):
    code = imports + "\nimport sys\nprint(sorted({name.split('.')[0] for name in sys.modules}))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    modules = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert not set(absent) & set(modules)
