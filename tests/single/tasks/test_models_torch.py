"""The PyTorch models (hvdtrain/tasks/models_torch.py): MNIST-1D's paper's two models, with its
parameter counts, and the residual MLP's skip connection."""

import pytest
import torch

from hvdtrain.run.config import typed
from hvdtrain.tasks.models_torch import build_model


def model(name):
    return build_model(typed({"model": {"name": name, "num_classes": 10}}).model)


@pytest.mark.parametrize("name,parameters", [("mnist1d_cnn", 5210), ("mnist1d_mlp", 15210)])
def test_the_mnist1d_models_have_the_papers_parameters(name, parameters):
    assert sum(p.numel() for p in model(name).parameters()) == parameters


@pytest.mark.parametrize("name", ["mnist1d_cnn", "mnist1d_mlp"])
def test_the_mnist1d_models_classify_a_batch_of_signals(name):
    assert model(name)(torch.randn(7, 1, 40)).shape == (7, 10)


def test_the_mlps_second_hidden_layer_adds_its_output_to_its_input():
    mlp = model("mnist1d_mlp")
    signals = torch.randn(7, 1, 40)
    with torch.no_grad():  # as the identity, it doubles its input
        mlp.hidden2.weight.copy_(torch.eye(100))
        mlp.hidden2.bias.zero_()
        hidden = mlp.hidden1(signals.flatten(1)).relu()
        torch.testing.assert_close(mlp(signals), mlp.classifier(2 * hidden))
