"""data.decode=gpu on a GPU (hvdtrain/tasks/image_folder_torch.py): nvJPEG gives the labels and,
to within its decoder's rounding, the pixels PIL gives in a loader worker, with the same crops;
batches decoded ahead on the side stream are those decoded one at a time on the current one;
the CMYK JPEG and the PNG are decoded by PIL and counted."""

import pytest
import torch

from hvdtrain.tasks.data import IMAGENET_STD
from hvdtrain.tasks.image_folder_torch import (DecodedImageFolder, EncodedImageFolder, _training_transform,
                                               device_decodes)
from hvdtrain.tasks.image_tree import make_image_tree

SIZE = 96
CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    make_image_tree(root, classes=4, train_per_class=16, val_per_class=2, seed=3)
    return root / "train"


def batches_of(dataset, count, batch=16):
    keys = [(i, 500 + i) for i in range(count)]
    return [dataset.collate([dataset[key] for key in keys[i:i + batch]]) for i in range(0, count, batch)]


def on_gpu(tree):
    return EncodedImageFolder(tree, training=True, skip_bad=False, size=SIZE, resize_size=SIZE)


def test_torchvisions_decoder_runs_on_the_gpu():
    assert device_decodes(CUDA)


def test_the_gpu_gives_the_labels_and_nearly_the_pixels_pil_gives(tree):
    cpu = DecodedImageFolder(tree, _training_transform(SIZE), skip_bad=False)
    [(expected, expected_labels, _)] = batches_of(cpu, 64, batch=64)
    dataset = on_gpu(tree)
    inputs = dataset.rank_inputs(CUDA, torch.float32, torch.contiguous_format)
    [(images, labels)] = list(inputs.batches(batches_of(dataset, 64, batch=64)))
    assert torch.equal(labels.cpu(), expected_labels)
    levels = (images.cpu() - expected).abs() * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
    assert levels.mean() < 1.5, f"mean difference {levels.mean():.2f} levels of 255, largest {levels.max():.0f}"


def test_batches_decoded_ahead_on_the_side_stream_are_those_decoded_in_turn(tree):
    dataset = on_gpu(tree)
    inputs = dataset.rank_inputs(CUDA, torch.bfloat16, torch.channels_last)
    pinned = [batch.pin_memory() for batch in batches_of(dataset, 64)]  # as the DataLoader hands them over on CUDA
    ahead = [(images.clone(), labels.clone()) for images, labels in inputs.batches(pinned)]
    in_turn = [inputs(batch) for batch in batches_of(dataset, 64)]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ahead, in_turn, strict=True))
    assert ahead[0][0].dtype == torch.bfloat16 and ahead[0][0].is_contiguous(memory_format=torch.channels_last)


def test_the_cmyk_jpeg_and_the_png_are_decoded_by_pil_and_counted(tree):
    dataset = on_gpu(tree)
    inputs = dataset.rank_inputs(CUDA, torch.float32, torch.contiguous_format)
    list(inputs.batches(batches_of(dataset, 64)))
    assert inputs.counts() == {"decoded_on_cpu": 2, "bad_files_skipped": 0}
