"""The TFRecord contract shared by the Beam writer and the trainer's parser.

Feature keys follow tensorflow/tpu ``imagenet_to_gcs.py``; the label convention does not: labels are
0..999, the position of the synset in the sorted list of the 1000 ILSVRC2012 synsets (the order
tensorflow-datasets uses too), with no reserved background class. Keep this module free of heavy imports:
the trainer imports it on TPU hosts that never run Beam.
"""

from __future__ import annotations

import functools
import importlib.resources
import os

IMAGE_ENCODED = "image/encoded"
IMAGE_FORMAT = "image/format"
LABEL = "image/class/label"
SYNSET = "image/class/synset"
HEIGHT = "image/height"
WIDTH = "image/width"
CHANNELS = "image/channels"
COLORSPACE = "image/colorspace"
FILENAME = "image/filename"

FEATURE_KEYS = (IMAGE_ENCODED, IMAGE_FORMAT, LABEL, SYNSET, HEIGHT, WIDTH, CHANNELS, COLORSPACE, FILENAME)

NUM_CLASSES = 1000
# image/class/label = LABEL_OFFSET + index of the synset (tensorflow/tpu's converter used 1, for a background
# class; here there is none). Written to manifest.json so readers need not assume it.
LABEL_OFFSET = 0
LABEL_CONVENTION = (
    "image/class/label is 0..999: the index of image/class/synset in the sorted list of the 1000 "
    "ILSVRC2012 synsets (tensorflow-datasets imagenet2012 order); no background class"
)

TRAIN = "train"
VALIDATION = "validation"
SPLITS = (TRAIN, VALIDATION)

NUM_TRAIN_IMAGES = 1_281_167
NUM_VALIDATION_IMAGES = 50_000


# The ILSVRC2012 devkit's facts, shipped with this package (effnet_common/data/): the 1000 synsets in label
# order, and the synset of each of the 50,000 official validation images. The same lists tensorflow-datasets
# ships (tests/test_schema.py compares them where it is installed); reading them needs no third-party package.
SYNSETS_FILE = "imagenet2012_synsets.txt"
VALIDATION_SYNSETS_FILE = "imagenet2012_validation_synsets.txt"


def _data_lines(name: str) -> tuple[str, ...]:
    text = importlib.resources.files("effnet_common").joinpath("data", name).read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


@functools.cache
def synsets() -> tuple[str, ...]:
    """The 1000 ILSVRC2012 synset ids (wnids) in label order."""
    ids = _data_lines(SYNSETS_FILE)
    if len(ids) != NUM_CLASSES or list(ids) != sorted(ids):
        raise RuntimeError(f"{SYNSETS_FILE}: expected {NUM_CLASSES} sorted synsets, found {len(ids)}")
    return ids


@functools.cache
def synset_to_label() -> dict[str, int]:
    return {wnid: i for i, wnid in enumerate(synsets())}


@functools.cache
def validation_synsets() -> tuple[str, ...]:
    """Synset of each official validation image: entry i labels ``ILSVRC2012_val_{i+1:08d}.JPEG``."""
    wnids = _data_lines(VALIDATION_SYNSETS_FILE)
    if len(wnids) != NUM_VALIDATION_IMAGES:
        raise RuntimeError(
            f"{VALIDATION_SYNSETS_FILE}: expected {NUM_VALIDATION_IMAGES} lines, found {len(wnids)}"
        )
    return wnids


def validation_filename(index: int) -> str:
    """File name of the official validation image at 0-based ``index``."""
    return f"ILSVRC2012_val_{index + 1:08d}.JPEG"


def validation_synset_for(filename: str) -> str | None:
    """Synset of an official validation file name (basename), or None when the name is not one."""
    base = os.path.basename(filename)
    if not (base.startswith("ILSVRC2012_val_") and base.endswith(".JPEG")):
        return None
    digits = base[len("ILSVRC2012_val_") : -len(".JPEG")]
    if len(digits) != 8 or not digits.isdigit():
        return None
    index = int(digits) - 1
    table = validation_synsets()
    return table[index] if 0 <= index < len(table) else None


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}"
