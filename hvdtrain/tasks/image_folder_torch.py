"""ImageFolder trees (data.source=imagefolder) as PyTorch datasets, decoded one of two ways
(data.decode, chosen in the plan):

- cpu: a loader worker reads, decodes (PIL), crops, resizes and flips each sample, as
  torchvision's ImageFolder and transforms do;
- gpu: a loader worker only reads each file's bytes (and draws its crop from the size in its JPEG
  header); the rank decodes the whole batch on its GPU with torchvision's batched nvJPEG decoder,
  and crops, resizes, flips and normalizes there (DeviceImages), in a thread of its own a batch or
  two ahead of training. Files that decoder does not take (not a JPEG, CMYK) are decoded by PIL in
  the worker, and counted.

Either way the crop and flip of a training sample come from its seed (tasks/image_files.py), so
a sample looks the same decoded either way, in any run, rank or worker. A file PIL cannot read
either stops the run with one line naming it, or with data.bad_files=skip is left out of its
batch and counted. A module of its own so that other data sources do not import torchvision.
"""

import itertools
import queue
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, Optional

import torch
import torchvision
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from hvdtrain.tasks.data import IMAGENET_MEAN, IMAGENET_STD, BadFile, check_classes
from hvdtrain.tasks.image_files import Crop, device_decodable, jpeg_frame, random_crop


class Unreadable(NamedTuple):
    """What a loader worker gives for a file PIL cannot read either: the rank decides (data.bad_files)."""
    path: str
    reason: str


def image_folders(data_cfg, num_classes, decode):
    """(training set, validation set) of root/train and root/val for `decode` ("cpu" or "gpu")."""
    root, skip = Path(data_cfg.root), data_cfg.bad_files == "skip"
    if decode == "gpu":
        sizes = dict(size=data_cfg.image_size, resize_size=data_cfg.resize_size)
        train = EncodedImageFolder(root / "train", training=True, skip_bad=skip, **sizes)
        val = EncodedImageFolder(root / "val", training=False, skip_bad=skip, **sizes)
    else:
        train = DecodedImageFolder(root / "train", _training_transform(data_cfg.image_size), skip_bad=skip)
        val = DecodedImageFolder(root / "val", _validation_transform(data_cfg.resize_size, data_cfg.image_size),
                                 skip_bad=skip)
    check_classes(data_cfg, train.classes, val.classes, num_classes)
    return train, val


def read_rgb(path):
    """A file decoded by PIL as RGB, or Unreadable."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError) as error:  # what PIL raises for a file it cannot read
        return Unreadable(str(path), str(error))


def device_decodes(device):
    """Whether torchvision's JPEG decoder runs on `device` (a build without nvJPEG does not)."""
    try:
        decode_jpeg(encode_jpeg(torch.zeros((3, 8, 8), dtype=torch.uint8)), device=device)
    except RuntimeError:
        return False
    return True


def left_out(unreadable, skip_bad):
    """How many `unreadable` files a batch leaves out (data.bad_files=skip), or BadFile naming the first."""
    if unreadable and not skip_bad:
        raise BadFile(f"{unreadable[0].path}: no decoder reads it ({unreadable[0].reason}); fix or remove it, or "
                      f"leave such files out with data.bad_files=skip")
    return len(unreadable)


def _normalized():
    """A PIL image to a float tensor normalized as ImageNet is."""
    return v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def _training_transform(size):
    normalize = _normalized()

    def transform(image, seed):
        crop = random_crop(seed, image.height, image.width)
        image = F.resized_crop(image, crop.top, crop.left, crop.height, crop.width, [size, size], antialias=True)
        return normalize(F.horizontal_flip(image) if crop.flip else image)
    return transform


def _validation_transform(resize_size, size):
    steps = v2.Compose([v2.Resize(resize_size, antialias=True), v2.CenterCrop(size), _normalized()])
    return lambda image, _seed: steps(image)


class DecodedImageFolder(torchvision.datasets.ImageFolder):
    """data.decode=cpu: samples decoded and transformed in the loader workers, asked for by (index,
    seed)."""

    def __init__(self, root, transform, skip_bad):
        super().__init__(root)
        self.seeded_transform, self.skip_bad = transform, skip_bad

    def __getitem__(self, key):
        index, seed = key
        path, label = self.samples[index]
        image = read_rgb(path)
        return image if isinstance(image, Unreadable) else (self.seeded_transform(image, seed), label)

    @staticmethod
    def collate(samples):
        """(images, labels, the Unreadable files) of a batch of samples."""
        kept = [sample for sample in samples if not isinstance(sample, Unreadable)]
        images = torch.stack([image for image, _ in kept]) if kept else torch.empty(0)
        return (images, torch.tensor([label for _, label in kept], dtype=torch.int64),
                [sample for sample in samples if isinstance(sample, Unreadable)])

    def rank_inputs(self, device, dtype, memory_format):
        return DecodedInputs(self.skip_bad)


class DecodedInputs:
    """data.decode=cpu on a rank: the loader's batches as they are; the bad files stop the run, or
    are left out and counted."""

    def __init__(self, skip_bad):
        self.skip_bad, self.skipped = skip_bad, 0

    def batches(self, loader):
        for images, labels, unreadable in loader:
            self.skipped += left_out(unreadable, self.skip_bad)
            yield images, labels

    def counts(self):
        """This rank's counts since the last call."""
        counts, self.skipped = {"decoded_on_cpu": 0, "bad_files_skipped": self.skipped}, 0
        return counts


@dataclass
class EncodedSample:
    """A sample as a loader worker reads it: a JPEG's bytes for the device's decoder (`encoded`,
    which its batch gathers into one buffer), or the image PIL decoded."""
    label: int
    crop: Optional[Crop]  # training only
    encoded: Optional[bytes] = None
    decoded: Optional[torch.Tensor] = None  # 3 x H x W uint8
    path: str = ""


class EncodedImageFolder(torchvision.datasets.ImageFolder):
    """data.decode=gpu: a sample's file bytes and its crop, asked for by (index, seed); files the
    device's decoder does not take are decoded here, by PIL. None for a bad file left out."""

    def __init__(self, root, training, skip_bad, size, resize_size):
        super().__init__(root)
        self.training, self.skip_bad, self.size, self.resize_size = training, skip_bad, size, resize_size

    def __getitem__(self, key):
        index, seed = key
        path, label = self.samples[index]
        data = Path(path).read_bytes()
        frame = jpeg_frame(data)
        if device_decodable(frame):
            crop = random_crop(seed, frame.height, frame.width) if self.training else None
            return EncodedSample(label, crop, encoded=data, path=path)
        image = read_rgb(path)
        if isinstance(image, Unreadable):
            return image
        decoded = F.pil_to_tensor(image)
        crop = random_crop(seed, decoded.shape[1], decoded.shape[2]) if self.training else None
        return EncodedSample(label, crop, decoded=decoded, path=path)

    @staticmethod
    def collate(samples):
        return EncodedBatch([sample for sample in samples if not isinstance(sample, Unreadable)],
                            [sample for sample in samples if isinstance(sample, Unreadable)])

    def rank_inputs(self, device, dtype, memory_format):
        return DeviceImages(device, self.size, self.resize_size, self.skip_bad, dtype, memory_format)


class EncodedBatch:
    """A batch as a loader worker hands it to the rank: its JPEGs' bytes one after another in one
    tensor (`encoded`), the samples (those PIL decoded with their images), their labels, and the
    files nothing read. One buffer, not a tensor a sample: each tensor crosses from the worker as a
    block of shared memory of its own, which cost the receiving thread about 70 ms a batch of 256
    here, and is pinned on its own."""

    def __init__(self, samples, unreadable):
        self.unreadable = unreadable
        self.labels = torch.tensor([sample.label for sample in samples], dtype=torch.int64)
        self.lengths = [0 if sample.encoded is None else len(sample.encoded) for sample in samples]
        joined = bytearray().join(sample.encoded for sample in samples if sample.encoded is not None)
        self.encoded = torch.frombuffer(joined, dtype=torch.uint8) if joined else torch.empty(0, dtype=torch.uint8)
        self.samples = [replace(sample, encoded=None) for sample in samples]

    def jpegs(self):
        """(position in samples, the sample's JPEG bytes: a view of `encoded`) for each JPEG."""
        starts = itertools.accumulate(self.lengths, initial=0)
        return [(i, self.encoded[start:start + length])
                for i, (start, length) in enumerate(zip(starts, self.lengths)) if length]

    def pin_memory(self):
        """The DataLoader's pin_memory=True: the bytes the decoder reads and the labels, in
        page-locked memory."""
        self.labels, self.encoded = self.labels.pin_memory(), self.encoded.pin_memory()
        return self

    @property
    def decoded_on_cpu(self):
        return sum(sample.decoded is not None for sample in self.samples)


class DeviceImages:
    """data.decode=gpu on a rank: each EncodedBatch decoded on `device` (nvJPEG on a GPU; on the CPU
    the same code decodes with libjpeg, which the tests use), cropped and resized to `size` (for
    validation resized to `resize_size` and center-cropped), flipped and normalized, as `dtype` in
    `memory_format`. Counts the samples PIL decoded and the bad files left out.

    The batches are made by a thread of their own, up to AHEAD batches ahead of training, because
    torchvision's GPU decoder waits on the host for its batch to be decoded, and the loop that
    launches a batch's few kernels per sample is Python's: on the training thread both would add
    to every step. Both leave the GIL while they wait or run C++. On CUDA the thread works on a
    stream of its own; events, not the host, order its work before the step that uses it."""

    def __init__(self, device, size, resize_size, skip_bad, dtype=torch.float32, memory_format=torch.contiguous_format):
        self.device, self.size, self.resize_size, self.skip_bad = device, size, resize_size, skip_bad
        self.dtype, self.memory_format = dtype, memory_format
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.decoded_on_cpu = self.skipped = 0
        self._ahead = None

    def batches(self, loader):
        """(images, labels) on the device for each EncodedBatch of `loader`. The batches of an
        earlier call that were not all taken are dropped first: two threads must never iterate
        one loader (the training loader's workers persist from epoch to epoch)."""
        if self._ahead is not None:
            self._ahead.close()
        if self.stream is None:
            self._ahead = made_ahead(self, loader)
            return self._ahead
        self._ahead = made_ahead(self._on_side_stream, loader)
        return (self._handed_over(*made) for made in self._ahead)

    def _on_side_stream(self, batch):
        """The batch's tensors made on the side stream (the stream's context also makes its device
        the thread's), and the event that follows their making."""
        with torch.cuda.stream(self.stream):
            tensors = self(batch)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return tensors, ready

    def _handed_over(self, tensors, ready):
        """The tensors made on the side stream, for use on the current one: it waits for their
        event, and the caching allocator keeps their memory until its work on them is done."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(ready)
        for tensor in tensors:
            tensor.record_stream(current)
        return tensors

    def counts(self):
        """This rank's counts since the last call."""
        counts = {"decoded_on_cpu": self.decoded_on_cpu, "bad_files_skipped": self.skipped}
        self.decoded_on_cpu = self.skipped = 0
        return counts

    def __call__(self, batch):
        """(images, labels) on the device for one EncodedBatch."""
        self.skipped += left_out(batch.unreadable, self.skip_bad)
        images = self._decode(batch)
        kept = [i for i, image in enumerate(images) if not isinstance(image, Unreadable)]
        self.decoded_on_cpu += batch.decoded_on_cpu
        self.skipped += left_out([image for image in images if isinstance(image, Unreadable)], self.skip_bad)
        out = torch.stack([self._transform(images[i], batch.samples[i].crop) for i in kept]) if kept \
            else torch.empty((0, 3, self.size, self.size), dtype=torch.uint8, device=self.device)
        out = ((out.float().div_(255) - self.mean) / self.std).to(self.dtype)
        # indexing would copy the labels out of pinned memory, making the copy to the GPU synchronous
        labels = (batch.labels if len(kept) == len(images) else batch.labels[kept]).to(self.device, non_blocking=True)
        return out.contiguous(memory_format=self.memory_format), labels

    def _decode(self, batch):
        """Each sample's 3 x H x W uint8 image on the device, or Unreadable. The
        JPEGs go to the decoder as one batch; where it refuses the batch, one by one, and a file
        it refuses goes to PIL."""
        images = [None if s.decoded is None else s.decoded.to(self.device, non_blocking=True) for s in batch.samples]
        jpegs = batch.jpegs()
        if not jpegs:
            return images
        try:
            decoded = decode_jpeg([encoded for _, encoded in jpegs], mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            decoded = [self._decode_one(encoded, batch.samples[i].path) for i, encoded in jpegs]
        for (i, _), image in zip(jpegs, decoded):
            images[i] = image
        return images

    def _decode_one(self, encoded, path):
        try:
            return decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            pass
        image = read_rgb(path)
        if isinstance(image, Unreadable):
            return image
        self.decoded_on_cpu += 1
        return F.pil_to_tensor(image).to(self.device)

    def _transform(self, image, crop):
        if crop is None:
            image = F.resize(image, [self.resize_size], antialias=True)
            return F.center_crop(image, [self.size, self.size])
        image = F.resized_crop(image, crop.top, crop.left, crop.height, crop.width, [self.size, self.size],
                               antialias=True)
        return F.horizontal_flip(image) if crop.flip else image


_MADE, _FAILED, _ENDED = "made", "failed", "ended"  # what made_ahead's thread hands over
AHEAD = 2  # batches a thread of made_ahead may have ready: enough to absorb a slow batch, few on the device


def made_ahead(make, items, ahead=AHEAD):
    """make(item) for each of `items`, in order, computed by a thread of its own up to `ahead`
    results ahead of the caller. An error in `items` or in `make` is raised to the caller where
    its item would have come. Closing the generator stops the thread once its current item is
    done, and waits for it; the thread is a daemon, so that a generator left suspended by an
    error elsewhere cannot keep the process from exiting."""
    results = queue.Queue(ahead)
    closing = threading.Event()

    def put(result):
        while not closing.is_set():
            try:
                results.put(result, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def work():
        try:
            for item in items:
                if closing.is_set() or not put((_MADE, make(item))):
                    return
        except BaseException as error:  # every error reaches the caller, whatever it is
            put((_FAILED, error))
            return
        put((_ENDED, None))

    thread = threading.Thread(target=work, name="hvdtrain-made-ahead", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = results.get()
            if kind is _ENDED:
                return
            if kind is _FAILED:
                raise value
            yield value
    finally:
        closing.set()
        thread.join()

