import json
import os

import pytest

from hvdtrain.training import checkpoint
from support.configs import compose


def decode(data):
    return json.loads(data)


def save(directory, step, keep, payload=None):
    """A checkpoint of `step` whose framework state is JSON."""
    state = json.dumps(payload or {"weights": step}).encode()
    checkpoint.save(directory, {"global_step": step, "epoch": step // 10}, state, keep=keep)


def test_keeps_the_last_k_and_finds_the_newest(tmp_path):
    for step in (10, 20, 30, 40):
        save(tmp_path, step, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000000020.ckpt", "step-000000030.ckpt", "step-000000040.ckpt"]
    path, state = checkpoint.load_newest_valid(tmp_path, decode)
    assert path.name == "step-000000040.ckpt" and state == {"global_step": 40, "epoch": 4, "weights": 40}


def test_a_truncated_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path):
    for step in (10, 20):
        save(tmp_path, step, keep=5, payload={"weights": step, "pad": "x" * 100})
    newest = checkpoint.path_for(tmp_path, 20)
    newest.write_bytes(newest.read_bytes()[:-30])
    with pytest.warns(UserWarning, match=str(newest)):
        path, state = checkpoint.load_newest_valid(tmp_path, decode)
    assert state["global_step"] == 10


def test_a_corrupt_state_is_found_by_its_checksum_without_the_framework(tmp_path):
    """The `hvdtrain` command reads the metadata alone; a flipped byte in the framework's state
    makes the checkpoint invalid there too, and it says nothing: the training loop warns."""
    for step in (10, 20):
        save(tmp_path, step, keep=5, payload={"weights": "w" * 200})
    newest = checkpoint.path_for(tmp_path, 20)
    data = bytearray(newest.read_bytes())
    data[data.index(b"wwww")] ^= 1
    newest.write_bytes(bytes(data))
    assert checkpoint.newest_metadata(tmp_path) == {"global_step": 10, "epoch": 1}
    assert checkpoint.newest_metadata(tmp_path / "none") is None


def test_an_interrupted_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    save(tmp_path, 10, keep=2)

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)  # the process dies after writing, before renaming
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 10, keep=2, payload={"broken": True})
    monkeypatch.undo()
    assert checkpoint.load_newest_valid(tmp_path, decode)[1]["weights"] == 10
    save(tmp_path, 20, keep=2)
    assert not list(tmp_path.glob(".*.tmp")), "the next save removes the left-over temporary file"


def test_no_checkpoint(tmp_path):
    assert checkpoint.load_newest_valid(tmp_path / "none", decode) == (None, None)


def test_extending_a_run_keeps_its_checkpoints_compatible():
    """train.epochs says where training stops: resume=DIR train.epochs=N must find the run's
    checkpoints of its own config; any other key makes a checkpoint another run's."""
    cfg = compose()
    assert checkpoint.compatibility_hash(compose("train.epochs=30")) == checkpoint.compatibility_hash(cfg)
    assert checkpoint.compatibility_hash(compose("train.seed=1")) != checkpoint.compatibility_hash(cfg)
    assert cfg.train.epochs == 12, "the hash leaves the config it is given as it was"


def test_moving_a_run_to_another_device_keeps_its_checkpoints_compatible():
    """resume=DIR train.device=cpu goes on from a GPU's checkpoints: the device is not part of what
    a checkpoint must agree on."""
    cfg = compose()
    for device in ("cpu", "cuda"):
        assert checkpoint.compatibility_hash(compose(f"train.device={device}")) == checkpoint.compatibility_hash(cfg)
    assert checkpoint.compatibility_hash(compose("train.autocast=bf16")) != checkpoint.compatibility_hash(cfg)
    assert cfg.train.device == "auto", "the hash leaves the config it is given as it was"


def test_a_gpus_checkpoint_decodes_onto_the_cpu(monkeypatch):
    """A checkpoint saved from CUDA tensors names their GPU in its pickle; torch.load restores
    them there unless told otherwise, which fails on a machine without that GPU (and would put
    another rank's state on rank 0's GPU). Such a file is written here by tagging CPU storage as
    cuda:1, as torch.save does for a tensor on the second GPU."""
    import io

    import torch
    import torch.serialization

    from hvdtrain.training.train_torch import _decode

    state = {"model": {"weight": torch.arange(6.0).reshape(2, 3)}, "optimizer": {"state": {}}, "scaler": {}}
    with monkeypatch.context() as patched:
        patched.setattr(torch.serialization, "location_tag", lambda storage: "cuda:1")
        buffer = io.BytesIO()
        torch.save(state, buffer)
    data = buffer.getvalue()
    assert b"cuda:1" in data
    if not torch.cuda.is_available():  # what loading it as it was saved meets on a CPU machine
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(io.BytesIO(data), weights_only=True)
    decoded = _decode(data)
    assert decoded["model"]["weight"].device == torch.device("cpu")
    assert torch.equal(decoded["model"]["weight"], state["model"]["weight"])
