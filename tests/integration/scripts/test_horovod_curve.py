"""scripts/horovod_curve.py, run as a user runs it: the model's efficiency for Horovod's published
benchmark, from the dry runs of `hvdtrain` itself, written as the committed study's CSV and figure."""

import csv
import subprocess
import sys
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[3]
STUDY = REPO / "studies" / "horovod_scaling"
GPUS = [4, 16, 128, 512]  # of the study's 4 ... 512: the ends and the published points, to keep the test short


def rows(path):
    with open(path) as file:
        return list(csv.DictReader(file))


def test_the_curve_is_the_dry_runs_and_the_committed_study_is_current(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "horovod_curve.py"), "--out", str(tmp_path),
                             "--gpus", ",".join(map(str, GPUS))], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    made = rows(tmp_path / "efficiency.csv")
    assert made == [row for row in rows(STUDY / "efficiency.csv") if int(row["gpus"]) in GPUS]
    assert Image.open(tmp_path / "efficiency.png").size[0] > 0
    assert [line.split(":")[0] for line in result.stdout.splitlines()[1:]] == [
        f"{gpus} GPUs, {model}" for gpus in (16, 128, 512) for model in ("Inception V3", "ResNet-101", "VGG-16")]

    for model in ("resnet101", "inception_v3", "vgg16"):
        curve = [float(row["predicted_efficiency"]) for row in made if row["model"] == model]
        assert 1 >= curve[0] > curve[1] > curve[2] > curve[3] > 0
        published = [int(row["gpus"]) for row in made if row["model"] == model and row["published_efficiency"]]
        assert published == [16, 128, 512]

    committed = rows(STUDY / "efficiency.csv")
    assert sorted({int(row["gpus"]) for row in committed}) == [4, 8, 16, 32, 64, 128, 256, 512]
    vgg = [float(row["predicted_efficiency"]) for row in committed if row["model"] == "vgg16"]
    assert vgg == sorted(vgg, reverse=True)  # its 553 MB of gradients outgrow backward from the second server on
