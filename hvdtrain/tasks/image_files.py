"""What the two ways of decoding an ImageFolder tree (data.decode) share, without a framework:
which decoder a file can go to, read from its first bytes, and the random crop and flip of a
training sample, drawn from that sample's seed (hvdtrain/training/sharding.py) alone, so that a
sample gets the same box decoded by PIL in a loader worker or by nvJPEG on the GPU, in any run,
rank or worker that trains it.
"""

import math
from typing import NamedTuple, Optional

import numpy as np

# Inception's crop, as torchvision's RandomResizedCrop draws it: 8 % to 100 % of the area, an
# aspect ratio from 3/4 to 4/3 (uniform in its logarithm), 10 tries before the central crop.
CROP_AREA, CROP_ASPECT_RATIO, CROP_ATTEMPTS = (0.08, 1.0), (3 / 4, 4 / 3), 10

# JPEG markers: start of image, and the start-of-frame markers (baseline, extended, progressive,
# lossless, hierarchical and arithmetic variants) whose segment gives the size and components.
_START_OF_IMAGE = b"\xff\xd8"
_FRAME_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE_MARKERS = {0x01, *range(0xD0, 0xD8)}  # no length follows them


class JpegFrame(NamedTuple):
    height: int
    width: int
    components: int  # 1: grayscale, 3: YCbCr (colour), 4: CMYK or YCCK
    precision: int = 8  # bits a sample
    marker: int = 0xC0  # its start-of-frame marker, which names the coding process


class Crop(NamedTuple):
    top: int
    left: int
    height: int
    width: int
    flip: bool  # left-right, after the crop


def jpeg_frame(data) -> Optional[JpegFrame]:
    """The frame of a JPEG file's bytes, or None where they are not a JPEG (ImageNet holds a PNG
    and CMYK JPEGs under .JPEG names) or end before its frame header."""
    if bytes(data[:2]) != _START_OF_IMAGE:
        return None
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte before a marker
            at += 1
            continue
        if marker in _STANDALONE_MARKERS:
            at += 2
            continue
        length = int.from_bytes(bytes(data[at + 2:at + 4]), "big")
        if marker in _FRAME_MARKERS:
            if at + 10 > len(data):
                return None
            height = int.from_bytes(bytes(data[at + 5:at + 7]), "big")
            width = int.from_bytes(bytes(data[at + 7:at + 9]), "big")
            return JpegFrame(height, width, data[at + 9], precision=data[at + 4], marker=marker)
        at += 2 + length
    return None


# The coding processes nvJPEG decodes: baseline, extended and progressive DCT with Huffman codes,
# 8 bits a sample. The arithmetic-coded, lossless, hierarchical and 12-bit ones a batch holding
# one would fail whole, to be decoded again file by file.
_DEVICE_MARKERS = {0xC0, 0xC1, 0xC2}


def device_decodable(frame):
    """Whether nvJPEG, through torchvision, decodes this JPEG to RGB: grayscale and colour ones of
    the common coding processes; CMYK (4 components) and the rare processes go to the CPU."""
    return (frame is not None and frame.components in (1, 3) and frame.height > 0 and frame.width > 0
            and frame.precision == 8 and frame.marker in _DEVICE_MARKERS)


def random_crop(seed, height, width):
    """The training crop and flip of a `height` x `width` image for the sample seed `seed`."""
    rng = np.random.default_rng(seed)
    area = height * width
    low, high = math.log(CROP_ASPECT_RATIO[0]), math.log(CROP_ASPECT_RATIO[1])
    for _ in range(CROP_ATTEMPTS):
        target = area * rng.uniform(*CROP_AREA)
        ratio = math.exp(rng.uniform(low, high))
        crop_width, crop_height = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < crop_width <= width and 0 < crop_height <= height:
            top = int(rng.integers(0, height - crop_height + 1))
            left = int(rng.integers(0, width - crop_width + 1))
            return Crop(top, left, crop_height, crop_width, bool(rng.random() < 0.5))
    # None fitted (a very long image): its centre, at the nearest aspect ratio allowed
    ratio = width / height
    if ratio < CROP_ASPECT_RATIO[0]:
        crop_width, crop_height = width, round(width / CROP_ASPECT_RATIO[0])
    elif ratio > CROP_ASPECT_RATIO[1]:
        crop_width, crop_height = round(height * CROP_ASPECT_RATIO[1]), height
    else:
        crop_width, crop_height = width, height
    return Crop((height - crop_height) // 2, (width - crop_width) // 2, crop_height, crop_width,
                bool(rng.random() < 0.5))
