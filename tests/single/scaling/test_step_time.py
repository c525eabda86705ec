"""The scaling model (hvdtrain/scaling/step_time.py): the ring formulas on cases computed by hand,
what backward hides and what it does not, fusion, and the fit of a link to measurements."""

import random

import pytest

from hvdtrain.core.settings import Settings
from hvdtrain.scaling.step_time import (Link, Network, Overlap, Workload, allreduce_s, efficiency, fit_link,
                                        fused_buffers, ring_allreduce_s, samples_per_s, step_s)

GIGABYTE = 10**9
ONE_SECOND_A_GIGABYTE = Link(gbps=8.0, latency_us=5.0)  # 1e9 bytes take 1 s to cross
NETWORK = Network(across=Link(gbps=10.0, latency_us=20.0), within=Link(gbps=100.0, latency_us=2.0))
# Each gradient submitted on its own, as Horovod does (hvdtrain.torch's segments: below).
ENGINE = {"fusion_threshold_bytes": 64 * 2**20, "cycle_time_s": 0.001, "segment_bytes": 0}


def workload(gradient_bytes, compute_s=1.0, backward_fraction=0.5):
    return Workload(samples_per_step=32, compute_s=compute_s, backward_fraction=backward_fraction,
                    gradient_bytes=tuple(gradient_bytes))


def test_a_ring_costs_2_n_minus_1_steps_of_latency_and_2_n_minus_1_over_n_of_the_bytes():
    assert ring_allreduce_s(GIGABYTE, 1, ONE_SECOND_A_GIGABYTE) == 0.0
    assert ring_allreduce_s(GIGABYTE, 2, ONE_SECOND_A_GIGABYTE) == pytest.approx(1.0 + 2 * 5e-6, rel=1e-12)
    assert ring_allreduce_s(GIGABYTE, 4, ONE_SECOND_A_GIGABYTE) == pytest.approx(1.5 + 6 * 5e-6, rel=1e-12)
    assert ring_allreduce_s(0, 4, ONE_SECOND_A_GIGABYTE) == pytest.approx(6 * 5e-6, rel=1e-12)


def test_a_flat_ring_waits_for_the_slowest_link_it_crosses():
    assert allreduce_s(GIGABYTE, 1, 4, NETWORK) == ring_allreduce_s(GIGABYTE, 4, NETWORK.within)
    assert allreduce_s(GIGABYTE, 4, 1, NETWORK) == ring_allreduce_s(GIGABYTE, 4, NETWORK.across)
    slowest = Link(gbps=10.0, latency_us=20.0)
    assert allreduce_s(GIGABYTE, 2, 4, NETWORK) == ring_allreduce_s(GIGABYTE, 8, slowest)
    faster_within = Network(across=Link(gbps=10.0, latency_us=1.0), within=Link(gbps=100.0, latency_us=9.0))
    assert allreduce_s(GIGABYTE, 2, 4, faster_within) == ring_allreduce_s(GIGABYTE, 8, Link(10.0, 9.0))
    assert allreduce_s(GIGABYTE, 1, 1, NETWORK) == 0.0


def test_hierarchical_is_flat_on_one_host_or_one_slot():
    for hosts, slots in ((1, 4), (4, 1), (1, 1)):
        assert allreduce_s(GIGABYTE, hosts, slots, NETWORK, hierarchical=True) == \
            pytest.approx(allreduce_s(GIGABYTE, hosts, slots, NETWORK), rel=1e-12)


def test_hierarchical_is_a_ring_within_plus_the_shares_across():
    within = 2 * 3 / 4 * 0.08 + 6 * 2e-6  # 1 GB at 100 Gbit/s: 0.08 s
    # 4 rings of 1/4 GB each, at once through the host's one 10 Gbit/s link: 1 GB, 0.8 s.
    across = 2 * 1 / 2 * 0.8 + 2 * 20e-6
    assert allreduce_s(GIGABYTE, 2, 4, NETWORK, hierarchical=True) == pytest.approx(within + across, rel=1e-12)


def test_hierarchical_beats_a_flat_ring_across_hosts_of_several_ranks():
    assert allreduce_s(GIGABYTE, 2, 4, NETWORK, hierarchical=True) < allreduce_s(GIGABYTE, 2, 4, NETWORK)


def test_one_rank_reduces_nothing():
    assert step_s(workload([GIGABYTE]), 1, 1, NETWORK, **ENGINE) == 1.0
    assert efficiency(workload([GIGABYTE]), 1, 1, NETWORK, **ENGINE) == 1.0


def test_a_small_gradient_is_hidden_but_for_its_last_tensor():
    """Tensors ready further apart than a cycle are reduced one by one behind backward; the last
    one, ready when backward ends, waits a cycle and its own allreduce."""
    sizes = [1000 + k for k in range(50)]
    step = step_s(workload(sizes), 2, 4, NETWORK, **ENGINE)
    exposed = ENGINE["cycle_time_s"] + allreduce_s(sizes[-1], 2, 4, NETWORK)
    assert step == pytest.approx(1.0 + exposed, rel=1e-12)
    assert efficiency(workload(sizes), 2, 4, NETWORK, **ENGINE) == pytest.approx(1 / (1 + exposed), rel=1e-12)


def test_a_huge_gradient_leaves_its_whole_allreduce_after_compute():
    huge = [GIGABYTE] * 40
    buffers = fused_buffers(huge, ENGINE["fusion_threshold_bytes"])
    reduced_alone = sum(allreduce_s(nbytes, 8, 4, NETWORK) for nbytes in buffers)
    step = step_s(workload(huge, compute_s=0.1), 8, 4, NETWORK, **ENGINE)
    assert reduced_alone > 50 * 0.1  # the allreduce dwarfs the step's compute
    assert step == pytest.approx(0.1 + reduced_alone, rel=0.01)


def test_what_backward_overlaps_of_a_huge_gradient_is_saved_all_the_same():
    huge = [GIGABYTE] * 40
    buffers = fused_buffers(huge, ENGINE["fusion_threshold_bytes"])
    reduced_alone = sum(allreduce_s(nbytes, 8, 4, NETWORK) for nbytes in buffers)
    assert step_s(workload(huge, compute_s=0.1), 8, 4, NETWORK, **ENGINE) < 0.1 + reduced_alone


def test_more_buffers_pay_more_latency():
    """All gradients ready at once (no backward to hide in): the step is compute, a cycle and
    one allreduce per fused buffer; splitting the same bytes into 4 buffers adds 3 rings'
    latency and nothing else."""
    sizes = [10**6] * 4
    ready_at_once = workload(sizes, backward_fraction=0.0)
    one_buffer = step_s(ready_at_once, 2, 4, NETWORK, fusion_threshold_bytes=4 * 10**6, cycle_time_s=0.001,
                        segment_bytes=0)
    four_buffers = step_s(ready_at_once, 2, 4, NETWORK, fusion_threshold_bytes=10**6, cycle_time_s=0.001,
                          segment_bytes=0)
    assert one_buffer == pytest.approx(1.0 + 0.001 + allreduce_s(4 * 10**6, 2, 4, NETWORK), rel=1e-12)
    ring_latency = 2 * (8 - 1) * 20e-6
    assert four_buffers - one_buffer == pytest.approx(3 * ring_latency, rel=1e-9)
    assert step_s(ready_at_once, 2, 4, NETWORK, fusion_threshold_bytes=0, cycle_time_s=0.001, segment_bytes=0) == \
        pytest.approx(four_buffers, rel=1e-12)


def test_fusion_fills_each_buffer_in_order_up_to_the_threshold():
    assert fused_buffers([3, 3, 3, 5], 6) == [6, 3, 5]
    assert fused_buffers([10, 1, 1], 6) == [10, 2]  # a tensor over the threshold goes alone
    assert fused_buffers([3, 3], 0) == [3, 3]  # HOROVOD_FUSION_THRESHOLD=0: no fusion


def test_a_longer_cycle_exposes_more():
    sizes = [10**5] * 100
    assert step_s(workload(sizes), 2, 4, NETWORK, fusion_threshold_bytes=2**26, cycle_time_s=0.02) > \
        step_s(workload(sizes), 2, 4, NETWORK, fusion_threshold_bytes=2**26, cycle_time_s=0.001)


def test_the_engine_defaults_are_hvdtrains():
    sizes = [10**6] * 30
    assert step_s(workload(sizes), 4, 2, NETWORK) == step_s(
        workload(sizes), 4, 2, NETWORK, fusion_threshold_bytes=Settings.fusion_threshold_bytes,
        cycle_time_s=Settings.cycle_time_s, segment_bytes=Settings.segment_bytes)


def test_a_segment_waits_for_its_last_gradient():
    """One segment of the whole model: nothing is reduced before backward ends, so the whole
    allreduce is exposed; per gradient only the last one is."""
    sizes = [1000 + k for k in range(50)]
    engine = {**ENGINE, "segment_bytes": sum(sizes)}
    step = step_s(workload(sizes), 2, 4, NETWORK, **engine)
    assert step == pytest.approx(1.0 + ENGINE["cycle_time_s"] + allreduce_s(sum(sizes), 2, 4, NETWORK), rel=1e-12)
    assert step > step_s(workload(sizes), 2, 4, NETWORK, **ENGINE)


def test_throughput_is_every_rank_s_batch_over_the_step():
    job = workload([10**7] * 20)
    assert samples_per_s(job, 3, 2, NETWORK, **ENGINE) == pytest.approx(
        6 * 32 / step_s(job, 3, 2, NETWORK, **ENGINE), rel=1e-12)
    assert samples_per_s(job, 3, 2, NETWORK, **ENGINE) == pytest.approx(
        6 * 32 / job.compute_s * efficiency(job, 3, 2, NETWORK, **ENGINE), rel=1e-12)


def ring_measurements(link, noise=0.0, seed=0):
    draw = random.Random(seed)
    return [(ranks, nbytes, ring_allreduce_s(nbytes, ranks, link) * (1 + noise * draw.gauss(0, 1)))
            for ranks in (2, 3, 4, 8) for nbytes in (10**3, 10**4, 10**5, 10**6, 10**7, 10**8)]


def test_fit_link_recovers_the_link_of_noise_free_measurements():
    fitted = fit_link(ring_measurements(Link(gbps=12.5, latency_us=7.0)))
    assert fitted.gbps == pytest.approx(12.5, rel=1e-9)
    assert fitted.latency_us == pytest.approx(7.0, rel=1e-9)


def test_fit_link_comes_close_with_noise():
    fitted = fit_link(ring_measurements(Link(gbps=12.5, latency_us=7.0), noise=0.03, seed=1))
    assert fitted.gbps == pytest.approx(12.5, rel=0.05)
    assert fitted.latency_us == pytest.approx(7.0, rel=0.1)


def test_fit_link_keeps_the_latency_at_zero_rather_than_below():
    measurements = [(ranks, nbytes, seconds * (0.9 if nbytes < 10**6 else 1.0))
                    for ranks, nbytes, seconds in ring_measurements(Link(gbps=5.0, latency_us=0.0))]
    fitted = fit_link(measurements)
    assert fitted.latency_us == 0.0
    assert fitted.gbps == pytest.approx(5.0, rel=0.1)


def test_fit_link_needs_more_than_one_size():
    with pytest.raises(ValueError, match="more than one size"):
        fit_link([(4, 10**6, 0.01), (4, 10**6, 0.011)])


def test_where_overlap_is_not_free_backward_and_the_reductions_slow_each_other_while_both_run():
    """Two gradients, ready at a quarter and at half of a step of 1 s (backward 0.5 s), whose
    allreduces take 0.5 s and 0.1 s alone; each side runs at half speed while the other runs."""
    two = workload([10**9, 2 * 10**8], compute_s=1.0, backward_fraction=0.5)
    link = Network(across=Link(gbps=16.0, latency_us=0.0), within=Link(gbps=16.0, latency_us=0.0))
    engine = {"fusion_threshold_bytes": 0, "cycle_time_s": 0.0}
    # Alone: the first reduction runs 0.25-0.75, the second 0.75-0.85; then forward and update.
    assert step_s(two, 2, 1, link, **engine) == pytest.approx(0.5 + 0.85, rel=1e-12)
    assert step_s(two, 2, 1, link, **engine, overlap=Overlap(1.0, 1.0)) == step_s(two, 2, 1, link, **engine)
    # Both slowed 2x: backward's last 0.25 s take 0.25-0.75, the first reduction does 0.25 s of its
    # 0.5 meanwhile and the rest alone by 1.0; the second runs 1.0-1.1.
    assert step_s(two, 2, 1, link, **engine, overlap=Overlap(2.0, 2.0)) == pytest.approx(0.5 + 1.1, rel=1e-12)
    # Only backward slowed: it ends at 0.75, and so does the first reduction; the second 0.75-0.85.
    assert step_s(two, 2, 1, link, **engine, overlap=Overlap(2.0, 1.0)) == pytest.approx(0.5 + 0.85, rel=1e-12)
