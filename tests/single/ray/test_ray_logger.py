"""hvdtrain.ray.ray_logger outside a rank of a RayExecutor (in one: tests/cluster/test_ray.py)."""

import warnings

import pytest

from hvdtrain.ray import ray_logger


def test_log_outside_a_rank_warns_once_and_sends_nothing(monkeypatch):
    monkeypatch.setattr(ray_logger, "_warned", False)
    with pytest.warns(UserWarning, match="ray_logger.log called outside a function run by a RayExecutor"):
        ray_logger.log({"loss": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ray_logger.log({"loss": 0.5})
