"""ImageNet-shaped ImageFolder trees made on the spot, to test and measure the image pipeline
without downloading ImageNet: root/{train,val}/<class>/<name>.JPEG, JPEGs of ImageNet's usual
sizes (around 500 x 375, either way up) at quality 90, on a noisy background, in which the class
is a shape of its own colour at a random place and size, so that a model reaches a high accuracy
on them only if the files, labels and augmentation are right.

As in ImageNet's training set, a few files are odd: about one in 40 is grayscale, and the first
class's train/ holds one CMYK JPEG and one PNG under a .JPEG name. `python
scripts/make_image_tree.py` makes one from the command line.
"""

import colorsys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SIZES = ((500, 375), (375, 500), (500, 333), (500, 400), (400, 300))  # (width, height): ImageNet's most common
GRAYSCALE_EVERY = 40
QUALITY = 90


def make_image_tree(root, classes=10, train_per_class=100, val_per_class=20, seed=0):
    """Write the tree under `root` and return {split: number of images}."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    counts = {}
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        for label in range(classes):
            folder = root / split / f"class_{label:04d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                image = _picture(rng, label, classes)
                path = folder / f"{split}_{label:04d}_{i:05d}.JPEG"
                odd = split == "train" and label == 0 and i in (1, 2)
                if odd and i == 1:
                    image.convert("CMYK").save(path, "JPEG", quality=QUALITY)
                elif odd:
                    image.save(path, "PNG")  # a PNG under a .JPEG name
                elif rng.integers(GRAYSCALE_EVERY) == 0:
                    image.convert("L").save(path, "JPEG", quality=QUALITY)
                else:
                    image.save(path, "JPEG", quality=QUALITY)
        counts[split] = classes * per_class
    return counts


def class_colour(label, classes):
    """The class's colour: hues spread evenly around the wheel, fully saturated."""
    return tuple(round(255 * c) for c in colorsys.hsv_to_rgb(label / classes, 1.0, 1.0))


def _picture(rng, label, classes):
    width, height = SIZES[rng.integers(len(SIZES))]
    background = rng.integers(60, 140, size=(height // 8, width // 8, 3), dtype=np.uint8)  # grey blotches
    image = Image.fromarray(background).resize((width, height), Image.BILINEAR)
    side = int(min(width, height) * rng.uniform(0.5, 0.8))
    left, top = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
    box = (left, top, left + side, top + side)
    draw = ImageDraw.Draw(image)
    colour = class_colour(label, classes)
    if label % 2:
        draw.ellipse(box, fill=colour)
    else:
        draw.rectangle(box, fill=colour)
    return image
