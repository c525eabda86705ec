import json
import os

import pytest

from hvdtrain.training import checkpoint


def decode(data):
    return json.loads(data)


def test_keeps_the_last_k_and_finds_the_newest(tmp_path):
    for step in (10, 20, 30, 40):
        checkpoint.save(tmp_path, step, json.dumps({"step": step}).encode(), keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000000020.ckpt", "step-000000030.ckpt", "step-000000040.ckpt"]
    path, state = checkpoint.load_newest_valid(tmp_path, decode)
    assert path.name == "step-000000040.ckpt" and state == {"step": 40}


def test_a_truncated_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path):
    for step in (10, 20):
        checkpoint.save(tmp_path, step, json.dumps({"step": step, "pad": "x" * 100}).encode(), keep=5)
    newest = checkpoint.path_for(tmp_path, 20)
    newest.write_bytes(newest.read_bytes()[:30])
    with pytest.warns(UserWarning, match=str(newest)):
        path, state = checkpoint.load_newest_valid(tmp_path, decode)
    assert state["step"] == 10


def test_an_interrupted_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, 10, b'{"step": 10}', keep=2)

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)  # the process dies after writing, before renaming
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, 10, b'{"step": 10, "broken', keep=2)
    monkeypatch.undo()
    assert checkpoint.load_newest_valid(tmp_path, decode)[1] == {"step": 10}
    checkpoint.save(tmp_path, 20, b'{"step": 20}', keep=2)
    assert not list(tmp_path.glob(".*.tmp")), "the next save removes the left-over temporary file"


def test_no_checkpoint(tmp_path):
    assert checkpoint.load_newest_valid(tmp_path / "none", decode) == (None, None)
