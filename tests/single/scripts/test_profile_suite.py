"""scripts/profile_suite.py: the share of the cores idle over a test's time, from /proc/stat samples
that span it, weighted by how much of each sampling interval the test overlaps."""

import pytest

from support.scripts import load_script


# (time, all jiffies, idle jiffies): from 0 to 10 s the cores sit idle a quarter of the time,
# from 10 to 20 s three quarters.
SAMPLES = [(0.0, 0, 0), (10.0, 1000, 250), (20.0, 2000, 1000)]


def test_a_test_within_one_interval_gets_that_intervals_idle_share():
    assert load_script("profile_suite").idle_share(SAMPLES, 2.0, 8.0) == pytest.approx(0.25)


def test_a_test_across_intervals_gets_their_shares_weighted_by_its_overlap():
    assert load_script("profile_suite").idle_share(SAMPLES, 5.0, 20.0) == pytest.approx((5 * 0.25 + 10 * 0.75) / 15)


def test_a_test_outside_the_samples_counts_as_busy():
    assert load_script("profile_suite").idle_share(SAMPLES, 30.0, 40.0) == 0.0
