"""The NCCL backend's plans, without a GPU (hvdtrain/core/nccl_backend.py): large tensors are
reduced whole and small ones packed up to the fusion threshold, and ranks that share a GPU are
found, on hosts as NCCL tells them apart. Its collectives on ranks are in
tests/parallel/core/test_nccl_backend.py and test_backend.py; what needs a device in tests/gpu/."""

import socket

from hvdtrain.core.fusion import Pack, Piece
from hvdtrain.core.nccl_backend import allreduce_steps, duplicate_devices, nccl_host
from hvdtrain.core.settings import MIB, Settings


def test_nccl_reduces_large_tensors_whole_and_packs_small_ones_up_to_the_threshold():
    settings = Settings(fusion_threshold_bytes=1 * MIB, pack_below_bytes=64 * 1024)
    large = 300 * MIB // 4
    steps = allreduce_steps([large, 1000, 1000, large, 16 * 1024] + [8 * 1024] * 40, 4, settings)
    assert steps[0] == Piece(0, 0, large) and Piece(3, 0, large) in steps  # one call, however large
    assert Piece(4, 0, 16 * 1024) in steps  # 64 KiB: reduced where it lies
    packs = [s for s in steps if isinstance(s, Pack)]
    assert len(packs) == 2 and all(p.elements * 4 <= 1 * MIB for p in packs)
    assert sorted(i for p in packs for i in p.indices) == [1, 2] + list(range(5, 45))
    off = allreduce_steps([1000, 1000], 4, Settings(fusion_threshold_bytes=0))
    assert off == (Piece(0, 0, 1000), Piece(1, 0, 1000))  # HOROVOD_FUSION_THRESHOLD=0: no fusion


def test_ranks_that_share_a_gpu_are_found():
    placements = [("a", "0000:01:00.0"), ("a", "0000:02:00.0"), ("b", "0000:01:00.0"), ("a", "0000:01:00.0")]
    assert duplicate_devices(placements) == [[0, 3]]
    assert duplicate_devices(placements[:3]) == []


def test_hosts_are_told_apart_as_nccl_tells_them(monkeypatch):
    monkeypatch.delenv("NCCL_HOSTID", raising=False)
    assert nccl_host() == socket.gethostname()
    monkeypatch.setenv("NCCL_HOSTID", "rank-1")  # ranks named as hosts of their own may share a GPU
    assert nccl_host() == "rank-1"
