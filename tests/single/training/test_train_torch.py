"""PyTorch's training loop in this process (hvdtrain/training/train_torch.py): a step leaves its
loss on the device, unread, and a checkpoint saved from a GPU decodes onto the CPU. Whole runs:
tests/parallel/training/test_train_torch.py."""

import contextlib
import io

import numpy as np
import pytest
import torch
import torch.serialization

from hvdtrain.training.train_torch import ToDevice, _decode, _train_step


@pytest.fixture
def step_loss(monkeypatch):
    """What _train_step returns for two batches on one process, with every way of reading a
    tensor's value failing the test while it runs."""
    class Optimizer(torch.optim.SGD):  # the DistributedOptimizer's protocol, on one process
        def synchronize(self):
            pass

        def skip_synchronize(self):
            return contextlib.nullcontext()

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = Optimizer(model.parameters(), lr=0.1)
    batches = iter([(torch.randn(2, 4), torch.tensor([0, 2])), (torch.randn(2, 4), torch.tensor([1, 1]))])
    scaler = torch.amp.GradScaler("cpu", enabled=False)

    def no_reading(*args):
        raise AssertionError("the loss was read")

    with monkeypatch.context() as patched:
        for name in ("item", "__float__", "tolist", "numpy"):
            patched.setattr(torch.Tensor, name, no_reading)
        return _train_step(model, optimizer, scaler, batches, 2, ToDevice(torch.device("cpu"), False), "none")


def test_a_step_leaves_its_mean_loss_an_unread_scalar_tensor(step_loss):
    assert isinstance(step_loss, torch.Tensor) and step_loss.dim() == 0 and not step_loss.requires_grad


def test_the_loss_a_step_leaves_is_finite(step_loss):
    assert np.isfinite(float(step_loss))


@pytest.fixture
def gpu_checkpoint(monkeypatch):
    """(a checkpoint's bytes as torch.save writes them from tensors on the second GPU, the state
    saved). A checkpoint saved from CUDA tensors names their GPU in its pickle; such a file is
    written here by tagging CPU storage as cuda:1, as torch.save does for a tensor there."""
    state = {"model": {"weight": torch.arange(6.0).reshape(2, 3)}, "optimizer": {"state": {}}, "scaler": {}}
    with monkeypatch.context() as patched:
        patched.setattr(torch.serialization, "location_tag", lambda storage: "cuda:1")
        buffer = io.BytesIO()
        torch.save(state, buffer)
    data = buffer.getvalue()
    assert b"cuda:1" in data
    return data, state


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU loads it where it was saved")
def test_a_gpus_checkpoint_loaded_as_saved_fails_without_the_gpu(gpu_checkpoint):
    """What torch.load does unless told otherwise (and it would put another rank's state on rank
    0's GPU)."""
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(io.BytesIO(gpu_checkpoint[0]), weights_only=True)


def test_a_gpus_checkpoint_decodes_onto_the_cpu(gpu_checkpoint):
    data, state = gpu_checkpoint
    decoded = _decode(data)
    assert decoded["model"]["weight"].device == torch.device("cpu")
    assert torch.equal(decoded["model"]["weight"], state["model"]["weight"])
