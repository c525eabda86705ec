"""What both ways of decoding an ImageFolder tree share (hvdtrain/tasks/image_files.py): the frame
read from a file's first bytes says which decoder takes it, and a training sample's crop and
flip follow from its seed alone, drawn as torchvision's RandomResizedCrop draws them."""

import io
import math

import numpy as np
import pytest
from PIL import Image

from hvdtrain.tasks.image_files import CROP_AREA, CROP_ASPECT_RATIO, JpegFrame, device_decodable, jpeg_frame, random_crop


def encoded(mode, size=(50, 30), kind="JPEG", **options):
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, kind, **options)
    return buffer.getvalue()


@pytest.mark.parametrize("mode, components", [("RGB", 3), ("L", 1), ("CMYK", 4)])
def test_a_jpegs_frame_gives_its_size_and_components(mode, components):
    assert jpeg_frame(encoded(mode)) == JpegFrame(30, 50, components)


def test_a_progressive_jpegs_frame_is_read_too():
    assert jpeg_frame(encoded("RGB", progressive=True)) == JpegFrame(30, 50, 3, precision=8, marker=0xC2)


def with_frame(marker, precision):
    """A baseline RGB JPEG's bytes with its start-of-frame marker and sample precision replaced
    (PIL writes neither arithmetic-coded, lossless nor 12-bit JPEGs)."""
    data = bytearray(encoded("RGB"))
    at = data.index(b"\xff\xc0")
    data[at + 1], data[at + 4] = marker, precision
    return bytes(data)


def test_a_frame_gives_its_coding_process_and_precision():
    assert jpeg_frame(with_frame(0xC9, 12)) == JpegFrame(30, 50, 3, precision=12, marker=0xC9)


@pytest.mark.parametrize("data", [encoded("RGB", kind="PNG"), b"not an image", encoded("RGB")[:20], b""],
                         ids=["a PNG", "text", "a JPEG cut before its frame", "nothing"])
def test_what_is_not_a_whole_jpeg_header_has_no_frame(data):
    assert jpeg_frame(data) is None


@pytest.mark.parametrize("mode, decodable", [("RGB", True), ("L", True), ("CMYK", False)])
def test_the_devices_decoder_takes_colour_and_grayscale_jpegs_not_cmyk(mode, decodable):
    assert device_decodable(jpeg_frame(encoded(mode))) == decodable


@pytest.mark.parametrize("marker, precision, decodable",
                         [(0xC1, 8, True), (0xC2, 8, True), (0xC0, 12, False), (0xC3, 8, False), (0xC9, 8, False),
                          (0xCA, 8, False), (0xC5, 8, False)],
                         ids=["extended", "progressive", "12-bit", "lossless", "arithmetic", "arithmetic progressive",
                              "hierarchical"])
def test_the_devices_decoder_takes_the_huffman_coded_8_bit_processes_only(marker, precision, decodable):
    assert device_decodable(jpeg_frame(with_frame(marker, precision))) == decodable


def test_a_crop_depends_on_the_seed_alone():
    assert random_crop(12345, 375, 500) == random_crop(12345, 375, 500)
    assert len({random_crop(seed, 375, 500) for seed in range(50)}) == 50


def test_crops_lie_inside_the_image_within_the_area_and_aspect_ratio_allowed():
    for seed in range(500):
        crop = random_crop(seed, 375, 500)
        assert 0 <= crop.top <= 375 - crop.height and 0 <= crop.left <= 500 - crop.width
        assert CROP_AREA[0] - 0.01 <= crop.height * crop.width / (375 * 500) <= CROP_AREA[1]
        assert CROP_ASPECT_RATIO[0] - 0.02 <= crop.width / crop.height <= CROP_ASPECT_RATIO[1] + 0.02


def test_crops_are_distributed_as_torchvisions_random_resized_crops():
    """Areas and aspect ratios of 4,000 crops of a 375 x 500 image, against as many of torchvision's
    own RandomResizedCrop.get_params: the same quantiles within sampling error."""
    import torch
    from torchvision.transforms import RandomResizedCrop

    torch.manual_seed(0)
    theirs = [RandomResizedCrop.get_params(torch.empty(3, 375, 500), CROP_AREA, CROP_ASPECT_RATIO)[2:]
              for _ in range(4000)]
    ours = [(crop.height, crop.width) for crop in (random_crop(seed, 375, 500) for seed in range(4000))]
    for shape in (lambda h, w: h * w / (375 * 500), lambda h, w: w / h):
        quantiles = [np.quantile([shape(*hw) for hw in crops], [0.1, 0.5, 0.9]) for crops in (theirs, ours)]
        assert np.allclose(*quantiles, atol=0.03), quantiles


def test_about_half_the_crops_are_flipped():
    assert 900 < sum(random_crop(seed, 375, 500).flip for seed in range(2000)) < 1100


def test_an_image_too_long_for_any_crop_gets_its_centre_at_the_nearest_ratio_allowed():
    crop = random_crop(7, 10, 1000)
    assert (crop.top, crop.height) == (0, 10) and crop.width == round(10 * CROP_ASPECT_RATIO[1])
    assert crop.left == (1000 - crop.width) // 2 and math.isclose(crop.width / crop.height, 1.3, abs_tol=0.04)
