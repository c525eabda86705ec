"""hvdtrain as a user installs it: a wheel, in a fresh virtual environment that sees neither the
checkout nor the PYTHONPATH of the tests, runs its recipes from any directory, lists them, and
copies one for the user to edit and run from their own folder."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(a fresh virtual environment with hvdtrain's wheel installed, a directory unrelated to the
    checkout, the environment its commands run with). The dependencies (several GB of torch and
    TensorFlow) are taken from this environment through a .pth line instead of being installed
    again; the editable install of hvdtrain is not, since .pth files of a directory added that way
    are not processed. Nothing is given PYTHONPATH: with it the checkout would be imported (and
    pip would call hvdtrain installed already) instead of the wheel."""
    root = tmp_path_factory.mktemp("wheel")
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(root / "dist"), str(REPO)], check=True, timeout=300, env=env)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120, env=env)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=env).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel, = (root / "dist").glob("hvdtrain-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    str(wheel)], check=True, timeout=300, env=env)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    # mpirun from the `openmpi` package lies beside this environment's Python.
    env["PATH"] = f"{os.environ['PATH']}:{Path(sys.executable).parent}"
    return venv, elsewhere, env


def hvdtrain(installed, *args, timeout=300):
    venv, elsewhere, env = installed
    return subprocess.run([str(venv / "bin" / "hvdtrain"), *args], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_wheel_is_not_the_checkout(installed):
    venv, elsewhere, env = installed
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import hvdtrain; print(hvdtrain.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout
    assert str(venv) in where and str(REPO) not in where


def test_the_wheel_carries_the_allreduce_rules_open_mpi_reads_across_hosts(installed):
    venv, elsewhere, env = installed
    rules = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "from hvdtrain.core import openmpi; print(openmpi.ALLREDUCE_RULES.read_text())"],
                           cwd=elsewhere, env=env, capture_output=True, text=True)
    assert rules.returncode == 0, rules.stderr
    assert rules.stdout == (REPO / "hvdtrain" / "core" / "openmpi_allreduce_rules.txt").read_text() + "\n"


def test_a_dry_run_from_an_unrelated_directory_plans_a_shipped_recipe(installed):
    plan = hvdtrain(installed, "recipe=resnet50_imagenet_8k", "cluster=32x8", "dry_run=true")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["global_batch_size"] == 8192


def test_the_default_recipe_reaches_its_target_from_an_unrelated_directory(installed):
    _, elsewhere, _ = installed
    run = hvdtrain(installed)
    assert run.returncode == 0, run.stderr[-3000:]
    results, = (elsewhere / "runs" / "digits").glob("*/results.json")
    assert json.loads(results.read_text())["metrics"]["val_top1"] >= 95.0


def test_ls_lists_the_shipped_recipes_with_their_targets(installed):
    listed = hvdtrain(installed, "ls")
    assert listed.returncode == 0
    rows = {line.split()[0] for line in listed.stdout.splitlines()[1:]}
    assert {"digits", "resnet50_imagenet_8k", "vgg16_synthetic"} <= rows
    assert "76.26" in listed.stdout  # the 8k recipe's target


@pytest.fixture(scope="module")
def copied(installed):
    """What `hvdtrain cp resnet50_imagenet mine --dir myconf` gave; the copy then edited to a
    per-worker batch of 16."""
    _, elsewhere, _ = installed
    result = hvdtrain(installed, "cp", "resnet50_imagenet", "mine", "--dir", "myconf")
    recipe = elsewhere / "myconf" / "recipe" / "mine.yaml"
    if recipe.is_file():
        recipe.write_text(recipe.read_text().replace("batch_size: 32", "batch_size: 16"))
    return result


def test_cp_copies_a_recipe_and_says_how_to_run_it(copied):
    assert copied.returncode == 0, copied.stderr
    assert "hvdtrain --config-dir myconf recipe=mine" in copied.stdout


def test_the_copy_runs_from_the_users_folder_with_their_edit(installed, copied):
    plan = hvdtrain(installed, "--config-dir", "myconf", "recipe=mine", "cluster=32x8", "dry_run=true")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["global_batch_size"] == 4096


def test_cp_refuses_to_overwrite_a_recipe(installed, copied):
    again = hvdtrain(installed, "cp", "digits", "mine", "--dir", "myconf")
    assert again.returncode == 2 and "exists already" in again.stderr


def test_cp_refuses_an_unknown_recipe_listing_the_shipped_ones(installed):
    unknown = hvdtrain(installed, "cp", "nope", "other")
    assert unknown.returncode == 2 and "unknown recipe 'nope'; shipped: digits," in unknown.stderr
