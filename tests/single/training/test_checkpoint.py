"""Checkpoint files (hvdtrain/training/checkpoint.py): the newest k kept; a truncated or corrupt
checkpoint skipped for the one before, a write cut short (by an exception or a real SIGKILL)
leaving the one before intact; and which config keys make a checkpoint another run's: not
train.epochs (resume extends a run) nor train.device (resume moves it)."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from hvdtrain.training import checkpoint

from support.configs import compose


def decode(data):
    return json.loads(data)


def save(directory, step, keep, payload=None):
    """A checkpoint of `step` whose framework state is JSON."""
    state = json.dumps(payload or {"weights": step}).encode()
    checkpoint.save(directory, {"global_step": step, "epoch": step // 10}, state, keep=keep)


def test_keeps_the_last_k(tmp_path):
    for step in (10, 20, 30, 40):
        save(tmp_path, step, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000000020.ckpt", "step-000000030.ckpt", "step-000000040.ckpt"]


def test_finds_the_newest_with_its_metadata(tmp_path):
    for step in (10, 20, 30, 40):
        save(tmp_path, step, keep=3)
    path, state = checkpoint.load_newest_valid(tmp_path, decode)
    assert path.name == "step-000000040.ckpt" and state == {"global_step": 40, "epoch": 4, "weights": 40}


def test_a_truncated_checkpoint_is_skipped_in_one_line_naming_it(tmp_path, capsys):
    for step in (10, 20):
        save(tmp_path, step, keep=5, payload={"weights": step, "pad": "x" * 100})
    newest = checkpoint.path_for(tmp_path, 20)
    newest.write_bytes(newest.read_bytes()[:-30])
    path, state = checkpoint.load_newest_valid(tmp_path, decode)
    assert state["global_step"] == 10
    said = capsys.readouterr()
    assert said.out == "" and said.err.startswith(f"hvdtrain: skipping checkpoint {newest}: it cannot be read (")
    assert len(said.err.splitlines()) == 1


def test_a_corrupt_state_is_found_by_its_checksum_without_the_framework(tmp_path, capsys):
    """The `hvdtrain` command reads the metadata alone; a flipped byte in the framework's state
    makes the checkpoint invalid there too, and it says nothing: the training loop says it."""
    for step in (10, 20):
        save(tmp_path, step, keep=5, payload={"weights": "w" * 200})
    newest = checkpoint.path_for(tmp_path, 20)
    data = bytearray(newest.read_bytes())
    data[data.index(b"wwww")] ^= 1
    newest.write_bytes(bytes(data))
    assert checkpoint.newest_metadata(tmp_path) == {"global_step": 10, "epoch": 1}
    assert capsys.readouterr().err == ""


def test_no_checkpoint_has_no_metadata(tmp_path):
    assert checkpoint.newest_metadata(tmp_path / "none") is None


def test_no_checkpoint(tmp_path):
    assert checkpoint.load_newest_valid(tmp_path / "none", decode) == (None, None)


@pytest.fixture
def interrupted_write(tmp_path, monkeypatch):
    """A checkpoint of step 10, then a second write of it that dies after writing, before renaming."""
    save(tmp_path, 10, keep=2)

    def crash(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", crash)
        with pytest.raises(KeyboardInterrupt):
            save(tmp_path, 10, keep=2, payload={"broken": True})
    return tmp_path


def test_an_interrupted_write_leaves_the_previous_checkpoint(interrupted_write):
    assert checkpoint.load_newest_valid(interrupted_write, decode)[1]["weights"] == 10


def test_the_next_save_removes_the_left_over_temporary_file(interrupted_write):
    save(interrupted_write, 20, keep=2)
    assert not list(interrupted_write.glob(".*.tmp"))


@pytest.fixture
def killed_while_writing(tmp_path):
    """The writer is SIGKILLed after it has written the new checkpoint's bytes, before the rename
    that would make it the newest."""
    directory = tmp_path / "checkpoints"
    script = textwrap.dedent(f"""
        import os, signal
        from hvdtrain.training import checkpoint

        checkpoint.save({str(directory)!r}, {{"global_step": 10}}, b"weights of step 10", keep=3)
        os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.save({str(directory)!r}, {{"global_step": 20}}, b"weights of step 20", keep=3)
    """)
    killed = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert killed.returncode == -signal.SIGKILL
    return directory


def test_a_kill_while_a_checkpoint_is_written_leaves_its_bytes_in_a_temporary_file(killed_while_writing):
    assert [p.name for p in killed_while_writing.iterdir() if p.name.endswith(".tmp")]


def test_a_kill_while_a_checkpoint_is_written_leaves_the_one_before_the_newest(killed_while_writing):
    assert checkpoint.newest_metadata(killed_while_writing)["global_step"] == 10
    assert checkpoint.read(checkpoint.path_for(killed_while_writing, 10), lambda state: {"state": state})["state"] == \
        b"weights of step 10"


def test_the_save_after_a_kill_clears_the_half_written_file(killed_while_writing):
    checkpoint.save(killed_while_writing, {"global_step": 30}, b"weights of step 30", keep=3)
    assert sorted(p.name for p in killed_while_writing.iterdir()) == ["step-000000010.ckpt", "step-000000030.ckpt"]


def test_extending_a_run_keeps_its_checkpoints_compatible():
    """train.epochs says where training stops: resume=DIR train.epochs=N must find the run's
    checkpoints of its own config."""
    assert checkpoint.compatibility_hash(compose("train.epochs=30")) == checkpoint.compatibility_hash(compose())


def test_another_seed_makes_a_checkpoint_another_runs():
    assert checkpoint.compatibility_hash(compose("train.seed=1")) != checkpoint.compatibility_hash(compose())


def test_moving_a_run_to_another_device_keeps_its_checkpoints_compatible():
    """resume=DIR train.device=cpu goes on from a GPU's checkpoints: the device is not part of what
    a checkpoint must agree on."""
    cfg = compose()
    for device in ("cpu", "cuda"):
        assert checkpoint.compatibility_hash(compose(f"train.device={device}")) == checkpoint.compatibility_hash(cfg)


def test_another_precision_makes_a_checkpoint_another_runs():
    assert checkpoint.compatibility_hash(compose("train.autocast=bf16")) != checkpoint.compatibility_hash(compose())


def test_the_hash_leaves_the_config_it_is_given_as_it_was():
    cfg = compose()
    checkpoint.compatibility_hash(cfg)
    assert (cfg.train.epochs, cfg.train.device) == (12, "auto")
