"""Fixtures every test directory may use: real ranks, and a tiny ImageFolder tree.

The suite is cut as the package is: tests/single/ runs in the test process itself, tests/parallel/
starts real ranks (mpirun) or the commands as a user runs them, tests/cluster/ needs hosts made
of network namespaces or a Slurm cluster (root), and tests/gpu/ needs a GPU."""

import pytest
from PIL import Image

from support.ranks import RankChecks, run_alone, run_ranks


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
