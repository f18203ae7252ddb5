"""Every record's label checked against the shards' classes as it is read (a wrong ``data.label_offset`` or a
record of another numbering stops the run with one line naming the shard)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import tensorflow as tf

from effnet_common import schema

LABEL_CHECK_MARK = "label check failed"


class LabelError(ValueError):
    """A shard holds a label that is not the class it should be (another converter's convention, a wrong
    ``data.label_offset``, or a label outside [0, num_classes))."""


class LabelChecker:
    """Turns a stored label into a class index and checks it, so an off-by-one never trains silently.

    The class is ``stored - label_offset`` (0 for beam_preprocess shards, 1 for tensorflow/tpu's
    ``imagenet_to_gcs.py``, whose labels are 1..1000). It must lie in [0, num_classes), and where the record
    carries a synset (``image/class/synset``, written by both converters) it must be that synset's position in
    the class list: the manifest's synsets (``manifest_classes``), or the sorted 1000 ImageNet synsets. With
    the wrong offset the very first record fails, naming its shard; so does a record of a synset that is not
    one of the classes. A failure surfaces as a tf.data error that ``raise_label_error`` turns into one
    ``LabelError`` line.

    Create it inside the dataset function (it holds a lookup table, which must live where the dataset does).
    """

    def __init__(self, label_offset: int = 0, num_classes: int = 1000, synsets: Sequence[str] | None = None):
        self.label_offset = label_offset
        self.num_classes = num_classes
        synsets = list(schema.synsets() if synsets is None else synsets)
        self._positions = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(synsets, tf.string), tf.range(len(synsets), dtype=tf.int32)
            ),
            default_value=-1,
        )

    def __call__(self, stored: tf.Tensor, synset: tf.Tensor, path: tf.Tensor) -> tf.Tensor:
        label = tf.cast(stored, tf.int32) - self.label_offset
        position = self._positions.lookup(synset)
        inside = tf.logical_and(label >= 0, label < self.num_classes)
        # A record without a synset is checked by its range alone.
        matches = tf.logical_or(tf.equal(synset, ""), tf.equal(position, label))
        check = tf.debugging.Assert(
            tf.logical_and(inside, matches),
            [
                LABEL_CHECK_MARK,
                "file:",
                path,
                "stored label:",
                stored,
                "synset:",
                synset,
                "position:",
                position,
            ],
        )
        with tf.control_dependencies([check]):
            return tf.identity(label)


def raise_label_error(error: tf.errors.OpError, label_offset: int, num_classes: int) -> None:
    """Re-raises a failed ``LabelChecker`` assertion as one readable ``LabelError``; returns otherwise."""
    message = getattr(error, "message", str(error))
    if LABEL_CHECK_MARK not in message:
        return

    def field(name):
        found = re.search(rf"{name}:\]?\s*\[?([^\]\s]*)", message)
        return found.group(1) if found else "?"

    path, stored, synset, position = field("file"), field("stored label"), field("synset"), field("position")
    if position not in ("?", "-1"):
        problem = f"synset {synset} is class {position}, but its stored label {stored} - data.label_offset"
        problem += f"={label_offset} is {int(stored) - label_offset}" if stored.lstrip("-").isdigit() else ""
    elif position == "-1" and synset not in ("", "?"):
        problem = (
            f"synset {synset} (stored label {stored}) is not one of the {num_classes} classes of the shards"
        )
    else:
        problem = f"stored label {stored} - data.label_offset={label_offset} is outside [0, {num_classes})"
    hint = ""
    if stored.lstrip("-").isdigit() and position.isdigit() and int(stored) - int(position) == 1:
        hint = " (shards of tensorflow/tpu's imagenet_to_gcs.py hold labels 1..1000: set data.label_offset=1)"
    raise LabelError(f"{path}: {problem}{hint}") from None
