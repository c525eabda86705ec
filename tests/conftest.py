"""Fixtures every test directory may use: real ranks, and a tiny ImageFolder tree.

The suite is cut by what a test starts: tests/single/ runs in the test process itself,
tests/parallel/ starts real ranks (mpirun) or the hvdtrain command as a user runs it,
tests/integration/ runs whole programs around them (hvdtrun's elastic jobs, Spark, a recipe trained
to its target, the studies' and benchmarks' scripts), tests/cluster/ needs hosts made of network
namespaces or a Slurm cluster (root), and tests/gpu/ needs a GPU. Within each, the tests mirror the
package."""

from pathlib import Path

import pytest
from PIL import Image

from support.ranks import RankChecks, run_alone, run_ranks


TESTS = Path(__file__).parent

# Under `pytest -n N --dist loadgroup` (make test, make test-cluster) a group runs in one worker: each
# file is a group, so that its module fixtures are made once; the files that read the training runs
# of tests/parallel/conftest.py are one, so that each run is trained once; and the cluster's files
# are one, as a session has one set of network-namespace hosts and one Slurm cluster, except those
# that start an engine of their own on the hosts (Ray, Spark): each of them is a group, which
# another worker may take, making hosts of its own in a second or two.
SHARED_RUNS = TESTS / "parallel" / "conftest.py"
OWN_ENGINE_FIXTURES = ("ray_cluster", "spark_session")


def _reads_shared_runs(item):
    definitions = item._fixtureinfo.name2fixturedefs.values()
    return any(Path(d[-1].func.__code__.co_filename) == SHARED_RUNS for d in definitions)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    groups = {item.path: item.path.relative_to(TESTS).as_posix() for item in items}
    own_engine = {item.path for item in items if set(OWN_ENGINE_FIXTURES) & set(item.fixturenames)}
    for item in items:
        if item.path.is_relative_to(TESTS / "cluster") and item.path not in own_engine:
            groups[item.path] = "cluster"
        elif _reads_shared_runs(item):
            groups[item.path] = "shared runs"
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.path]))


@pytest.fixture
def mpirun():
    return run_ranks


@pytest.fixture
def alone():
    return run_alone


@pytest.fixture(scope="module")
def ranks():
    """This module's jobs of checks (support/ranks.py): each job of N ranks runs once for all
    the tests that read its reports."""
    return RankChecks()


@pytest.fixture(scope="session")
def image_tree(tmp_path_factory):
    """A tiny ImageFolder tree: train/ and val/ with 3 classes of 12x12 RGB images whose colour
    says the class."""
    root = tmp_path_factory.mktemp("images")
    colours = {"red": (200, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 200)}
    for split, count in (("train", 8), ("val", 3)):
        for name, colour in colours.items():
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                shade = tuple(min(255, c + 5 * i) for c in colour)
                Image.new("RGB", (12 + i % 3, 12), shade).save(root / split / name / f"{i}.png")
    return root
