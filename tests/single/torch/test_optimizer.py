"""DistributedOptimizer's parts that need no ranks (hvdtrain/torch/optimizer.py): the segments
it plans from backward's order, and the gradient bucket, zeroed and on huge pages. Training on
real ranks is in tests/parallel/torch/test_optimizer.py."""

import os

import pytest
import torch

from hvdtrain.torch.optimizer import HUGE_PAGE_BYTES, _GradientBuckets, _huge_page_zeros, _segment_members


def test_segments_follow_backward_order_and_size():
    """Runs of about segment_bytes from the last parameter back, within one bucket; groups as
    given, other parameters alone; 0 puts each parameter on its own."""
    sizes = [10, 300, 20, 500, 40, 60]  # float32 elements
    params = [torch.nn.Parameter(torch.zeros(k)) for k in sizes]
    params.insert(3, torch.nn.Parameter(torch.zeros(7, dtype=torch.float64)))  # another bucket
    buckets = _GradientBuckets(params, "test")
    index = {p: i for i, p in enumerate(params)}

    def segments(groups=None, segment_bytes=0):
        return [[index[p] for p in members] for members in _segment_members(params, buckets, groups, segment_bytes)]

    assert segments(segment_bytes=1000) == [[6, 5, 4], [3], [2, 1], [0]]
    assert segments(segment_bytes=0) == [[6], [5], [4], [3], [2], [1], [0]]
    assert segments(segment_bytes=1 << 20) == [[6, 5, 4], [3], [2, 1, 0]]
    assert segments(groups={params[0]: 0, params[5]: 0, params[2]: 1}) == [[0, 5], [2], [1], [3], [4], [6]]


def _anon_huge_page_kib(address):
    """AnonHugePages of the mapping of this process that holds `address`."""
    inside = False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            inside = start <= address < end
        elif inside and fields[0] == "AnonHugePages:":
            return int(fields[1])
    raise AssertionError(f"no mapping holds address {address:#x}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_gradient_bucket_is_zeroed_and_on_huge_pages(dtype):
    numel = 3 * (1 << 20) + 5  # 6 to 24 MB, several huge pages
    bucket = _huge_page_zeros(numel, dtype)
    assert bucket.dtype == dtype and bucket.shape == (numel,) and bucket.is_contiguous()
    assert torch.count_nonzero(bucket) == 0
    bucket.fill_(1)  # touch every page
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read() if os.path.exists(
        "/sys/kernel/mm/transparent_hugepage/enabled") else "[never]"
    if "[never]" in thp:
        pytest.skip("transparent huge pages are disabled on this machine")
    # MPI reduces gradients 1.3x as fast from huge pages (README); torch.zeros gets none here.
    # Every whole huge page of the bucket is one.
    assert bucket.data_ptr() % HUGE_PAGE_BYTES == 0
    whole_pages_kib = bucket.numel() * bucket.element_size() // HUGE_PAGE_BYTES * (HUGE_PAGE_BYTES >> 10)
    assert _anon_huge_page_kib(bucket.data_ptr()) >= whole_pages_kib
