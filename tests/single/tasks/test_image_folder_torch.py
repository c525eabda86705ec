"""An ImageFolder tree decoded either way (hvdtrain/tasks/image_folder_torch.py), both on the CPU
(torchvision's decoder runs there too): the same sample gets the same crop, label and nearly the
same pixels decoded by PIL in a loader worker (data.decode=cpu) or batch by batch on the device
(data.decode=gpu); the files the device's decoder does not take are decoded by PIL and counted;
a file nothing reads stops the run naming it, or is left out and counted (data.bad_files=skip).
The rank's batches are made by a thread of their own ahead of training (made_ahead)."""

import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from hvdtrain.tasks.data import IMAGENET_STD, BadFile
from hvdtrain.tasks.image_folder_torch import (AHEAD, DecodedImageFolder, EncodedImageFolder, _training_transform,
                                               _validation_transform, made_ahead)
from hvdtrain.tasks.image_tree import make_image_tree

SIZE, RESIZE = 64, 73
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """An ImageNet-shaped tree of 3 classes, 12 training images each (a CMYK JPEG and a PNG named
    .JPEG among the first class's) and 4 validation images each."""
    root = tmp_path_factory.mktemp("tree")
    make_image_tree(root, classes=3, train_per_class=12, val_per_class=4, seed=1)
    return root


@pytest.fixture(scope="module")
def tree_with_a_bad_file(tree, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad") / "tree"
    shutil.copytree(tree, root)
    (root / "train" / "class_0001" / "bad.JPEG").write_bytes(b"\xff\xd8 a JPEG's first bytes and nothing more")
    return root


def decoded_on_cpu(root, split, keys, skip_bad=False):
    """(images, labels, the rank's inputs that counted them) for data.decode=cpu: decoded as the
    loader workers decode, handed over as the rank takes them."""
    transform = _training_transform(SIZE) if split == "train" else _validation_transform(RESIZE, SIZE)
    return one_batch(DecodedImageFolder(root / split, transform, skip_bad=skip_bad), keys)


def decoded_on_device(root, split, keys, skip_bad=False):
    """The same for data.decode=gpu, on the CPU."""
    return one_batch(EncodedImageFolder(root / split, training=split == "train", skip_bad=skip_bad, size=SIZE,
                                        resize_size=RESIZE), keys)


def one_batch(dataset, keys):
    inputs = dataset.rank_inputs(CPU, torch.float32, torch.contiguous_format)
    [(images, labels)] = inputs.batches([dataset.collate([dataset[key] for key in keys])])
    return images, labels, inputs


def keys(count):
    return [(index, 1000 + index) for index in range(count)]


@pytest.mark.parametrize("split, count", [("train", 36), ("val", 12)])
def test_both_ways_give_the_same_labels_and_nearly_the_same_pixels(tree, split, count):
    cpu_images, cpu_labels, _ = decoded_on_cpu(tree, split, keys(count))
    device_images, device_labels, _ = decoded_on_device(tree, split, keys(count))
    assert torch.equal(cpu_labels, device_labels) and cpu_images.shape == device_images.shape == (count, 3, SIZE, SIZE)
    levels = (cpu_images - device_images).abs() * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
    assert levels.max() <= 2 and levels.mean() < 0.05  # in 0-255 levels: rounding in the resize, no more


def test_the_same_sample_seed_gives_the_same_crop_and_another_seed_another(tree):
    first, _, _ = decoded_on_device(tree, "train", [(5, 1), (5, 1), (5, 2)])
    assert torch.equal(first[0], first[1]) and not torch.equal(first[0], first[2])


def test_the_devices_decoder_is_handed_colour_and_grayscale_jpegs_and_pil_the_rest(tree):
    dataset = EncodedImageFolder(tree / "train", training=True, skip_bad=False, size=SIZE, resize_size=RESIZE)
    decoded_by_pil = sorted(dataset.samples[i][0].split("/")[-1] for i in range(len(dataset))
                            if dataset[(i, 0)].decoded is not None)
    assert decoded_by_pil == ["train_0000_00001.JPEG", "train_0000_00002.JPEG"]  # the CMYK JPEG and the PNG


def test_a_batch_carries_its_jpegs_bytes_in_one_buffer(tree):
    dataset = EncodedImageFolder(tree / "train", training=True, skip_bad=False, size=SIZE, resize_size=RESIZE)
    batch = dataset.collate([dataset[key] for key in keys(12)])
    files = [dataset.samples[i][0] for i in range(12)]
    jpegs = {i: bytes(encoded.numpy()) for i, encoded in batch.jpegs()}
    assert jpegs == {i: Path(files[i]).read_bytes() for i in range(12) if batch.samples[i].decoded is None}
    assert len(jpegs) == 10 and len(batch.encoded) == sum(map(len, jpegs.values()))  # the CMYK JPEG and PNG: PIL's


def test_batches_through_loader_workers_are_those_made_in_process(tree):
    dataset = EncodedImageFolder(tree / "train", training=True, skip_bad=False, size=SIZE, resize_size=RESIZE)
    batches = [keys(36)[i:i + 12] for i in range(0, 36, 12)]
    loader = DataLoader(dataset, batch_sampler=batches, num_workers=2, collate_fn=dataset.collate)
    inputs = dataset.rank_inputs(CPU, torch.float32, torch.contiguous_format)
    through_workers = list(inputs.batches(loader))
    in_process = [inputs(dataset.collate([dataset[key] for key in batch])) for batch in batches]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(through_workers, in_process, strict=True))


def test_the_files_pil_decoded_are_counted(tree):
    _, _, inputs = decoded_on_device(tree, "train", keys(36))
    assert inputs.counts() == {"decoded_on_cpu": 2, "bad_files_skipped": 0}


@pytest.mark.parametrize("decoded", [decoded_on_cpu, decoded_on_device], ids=["cpu", "gpu"])
def test_a_file_nothing_reads_stops_the_run_naming_it(tree_with_a_bad_file, decoded):
    with pytest.raises(BadFile, match=r"class_0001/bad.JPEG: no decoder reads it .*data.bad_files=skip"):
        decoded(tree_with_a_bad_file, "train", keys(37))


@pytest.mark.parametrize("decoded", [decoded_on_cpu, decoded_on_device], ids=["cpu", "gpu"])
def test_a_file_nothing_reads_is_left_out_and_counted_where_asked(tree_with_a_bad_file, decoded):
    images, labels, inputs = decoded(tree_with_a_bad_file, "train", keys(37), skip_bad=True)
    assert len(images) == len(labels) == 36 and inputs.counts()["bad_files_skipped"] == 1


def made_ahead_threads():
    return [thread for thread in threading.enumerate() if thread.name == "hvdtrain-made-ahead"]


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_made_ahead_gives_the_results_in_order_made_at_most_ahead_of_the_caller():
    made = []
    results = made_ahead(lambda item: made.append(item) or item * item, range(20))
    assert next(results) == 0
    # taken: 0; waiting: AHEAD results; one more made and waiting for room
    assert wait_until(lambda: len(made) == AHEAD + 2)
    time.sleep(0.2)
    assert len(made) == AHEAD + 2
    assert list(results) == [i * i for i in range(1, 20)]


def test_made_ahead_raises_an_error_of_make_where_its_item_would_have_come():
    def make(item):
        if item == 2:
            raise ValueError("item 2 is bad")
        return item

    results = made_ahead(make, range(5))
    assert [next(results), next(results)] == [0, 1]
    with pytest.raises(ValueError, match="item 2 is bad"):
        next(results)


def test_made_ahead_raises_an_error_of_the_items():
    def items():
        yield 1
        raise OSError("the loader's worker died")

    results = made_ahead(lambda item: item, items())
    assert next(results) == 1
    with pytest.raises(OSError, match="worker died"):
        next(results)


def test_closing_made_ahead_stops_its_thread_and_the_making():
    made = []
    results = made_ahead(made.append, range(1000))
    next(results)
    results.close()
    assert not made_ahead_threads()
    count = len(made)
    time.sleep(0.1)
    assert len(made) == count < 1000


class WatchedLoader:
    """A loader that counts its iterations running at once."""

    def __init__(self, batches, watch):
        self.batches, self.watch = batches, watch

    def __iter__(self):
        self.watch["running"] += 1
        self.watch["most"] = max(self.watch["most"], self.watch["running"])
        try:
            yield from self.batches
        finally:
            self.watch["running"] -= 1


def test_the_batches_of_an_earlier_call_are_dropped_before_a_loader_is_iterated_again(tree):
    dataset = EncodedImageFolder(tree / "train", training=True, skip_bad=False, size=SIZE, resize_size=RESIZE)
    batches = [dataset.collate([dataset[key] for key in keys(36)[i:i + 4]]) for i in range(0, 36, 4)]
    inputs = dataset.rank_inputs(CPU, torch.float32, torch.contiguous_format)
    watch = {"running": 0, "most": 0}
    first_epoch = inputs.batches(WatchedLoader(batches, watch))
    next(first_epoch)  # an epoch left unfinished, its thread waiting with batches made
    second_epoch = list(inputs.batches(WatchedLoader(batches, watch)))
    assert len(second_epoch) == len(batches) and watch == {"running": 0, "most": 1}
    assert not made_ahead_threads()
