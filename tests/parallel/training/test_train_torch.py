"""PyTorch's training loop on real ranks (hvdtrain/training/train_torch.py): the validation metrics
are reduced over the ranks exactly, the BatchNorm statistics averaged. The default recipe, which
trains with it: tests/parallel/launch/test_cli.py."""

import functools

import pytest

from parallel.runs import TIMEOUT


@functools.cache
def evaluated():
    """(the metrics train_torch.evaluate reduces over the ranks, the model it evaluated, the
    validation set, the number of ranks): digits_cnn, its BatchNorm running means set to each
    rank's number, as if every rank had seen other data. Evaluated once a job, for all the
    checks that read it."""
    import torch

    import hvdtrain.torch as hvd
    from hvdtrain.run.config import typed
    from hvdtrain.tasks.data_torch import build_datasets, rank_inputs
    from hvdtrain.tasks.models_torch import build_model
    from hvdtrain.training.train_torch import ToDevice, evaluate

    hvd.init()
    cfg = typed({"model": {"name": "digits_cnn", "num_classes": 10}, "data": {"source": "digits", "val_size": 360},
                 "train": {"batch_size": 7}})
    torch.manual_seed(0)
    model = build_model(cfg.model)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.fill_(hvd.rank())
    _, val = build_datasets(cfg.data, 10, 0)
    cpu = torch.device("cpu")
    inputs = rank_inputs(val, cpu, torch.float32, torch.contiguous_format)
    metrics = evaluate(model, val, inputs, cfg, ToDevice(cpu, channels_last=False), "none")
    return metrics, model, val, hvd.size()


def logits_here(model, val):
    """The same model over the whole validation set, in this one process."""
    import torch

    model.eval()
    with torch.no_grad():
        return model(val.inputs)


def the_batchnorm_statistics_are_averaged_over_the_ranks():
    import torch

    _, model, _, size = evaluated()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            assert torch.all(module.running_mean == (size - 1) / 2)


def the_top1_accuracy_is_exact():
    metrics, model, val, _ = evaluated()
    correct = (logits_here(model, val).argmax(dim=1) == val.labels).sum().item()
    assert metrics["val_top1"] == 100.0 * correct / 360, (metrics, correct)


def the_top5_accuracy_is_exact():
    metrics, model, val, _ = evaluated()
    in_top5 = (logits_here(model, val).topk(5, dim=1).indices == val.labels[:, None]).any(dim=1).sum().item()
    assert metrics["val_top5"] == 100.0 * in_top5 / 360


def the_loss_is_the_whole_sets():
    import torch.nn.functional as F

    metrics, model, val, _ = evaluated()
    assert metrics["val_loss"] == pytest.approx(F.cross_entropy(logits_here(model, val), val.labels).item(), rel=1e-5)


VALIDATION = [the_batchnorm_statistics_are_averaged_over_the_ranks, the_top1_accuracy_is_exact,
              the_top5_accuracy_is_exact, the_loss_is_the_whole_sets]


@pytest.mark.parametrize("check", VALIDATION, ids=lambda check: check.__name__)
def test_validation_metrics_are_reduced_exactly_on_two_ranks(ranks, check):
    ranks.run(2, VALIDATION, timeout=TIMEOUT).assert_passed(check)
