"""Which classes a sharding run's labels number (``ShardingConfig.classes``), one registry of the choices.

- ``imagenet`` (the default): the 1000 ILSVRC2012 synsets in sorted order; a label is the synset's position
  among them (0..999), whatever the input holds.
- ``found``: the synsets of the training input, sorted; labels 0..K-1. A 10-class dataset filed under 10
  ImageNet synsets gets a 10-way classifier, not a 1000-way one whose label smoothing spreads 99% of its mass
  over classes that never occur.
- ``file``: the synsets of ``classes_file``, one wnid a line in label order (blank and '#' lines skipped).

An image whose synset is not one of the classes is a failure with that reason, never dropped silently. The
manifest records the class count and, unless they are ImageNet's 1000, the synsets in label order.

Pure Python (no Beam, no TensorFlow): the config validates names against ``CLASS_LISTS``, and the pipeline
builds the list once the training input is planned (``CLASS_LISTS.build(name, classes_file, found)``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable

from effnet_common import schema, storage
from effnet_common.manifest import LabelConvention
from effnet_common.registry import Registry

IMAGENET = "imagenet"
FOUND = "found"
FILE = "file"

CLASS_LISTS = Registry("classes")

_FOUND_CONVENTION = (
    "image/class/label is 0..{last}: the index of image/class/synset in the manifest's synsets list, "
    "the {count} synsets of the training input in sorted order; no background class"
)
_FILE_CONVENTION = (
    "image/class/label is 0..{last}: the index of image/class/synset in the manifest's synsets list, "
    "the {count} synsets of the class file {path} in its order; no background class"
)


@dataclasses.dataclass(frozen=True)
class ClassList:
    """The classes of one run in label order, and what a reader is told about them.

    Attributes:
      synsets: the wnids; a record's label is ``schema.LABEL_OFFSET`` + the index of its synset here.
      origin: where the list came from, for failure reasons ("the synsets of the training input").
      description: the manifest's label convention.
      imagenet: the 1000 ILSVRC2012 synsets (the manifest then leaves the list out).
    """

    synsets: tuple[str, ...]
    origin: str
    description: str
    imagenet: bool = False

    @functools.cached_property
    def labels(self) -> dict[str, int]:
        """Synset -> stored label."""
        return {wnid: schema.LABEL_OFFSET + i for i, wnid in enumerate(self.synsets)}

    def not_a_class(self, synset: str | None) -> str:
        """The failure reason of an image whose synset is not one of the classes."""
        return f"synset {synset} is not one of the {len(self.synsets)} classes ({self.origin})"

    def label_convention(self) -> LabelConvention:
        return LabelConvention(
            description=self.description,
            offset=schema.LABEL_OFFSET,
            num_classes=len(self.synsets),
            synsets=None if self.imagenet else self.synsets,
        )


@CLASS_LISTS.register(IMAGENET)
def imagenet_classes(classes_file: str = "", found: Iterable[str] = ()) -> ClassList:
    """The 1000 ILSVRC2012 synsets, sorted (tensorflow-datasets' order): labels 0..999."""
    del classes_file, found
    return ClassList(schema.synsets(), "the ILSVRC2012 synsets", schema.LABEL_CONVENTION, imagenet=True)


@CLASS_LISTS.register(FOUND)
def found_classes(classes_file: str, found: Iterable[str]) -> ClassList:
    """The distinct synsets of the training input's units, sorted."""
    del classes_file
    synsets = tuple(sorted(set(found)))
    last = max(len(synsets) - 1, 0)
    return ClassList(
        synsets,
        "classes=found: the synsets of the training input",
        _FOUND_CONVENTION.format(last=last, count=len(synsets)),
    )


@CLASS_LISTS.register(FILE)
def file_classes(classes_file: str, found: Iterable[str] = ()) -> ClassList:
    """The synsets of ``classes_file`` (``ShardingConfig.classes_file``), in the file's order."""
    del found
    synsets = read_class_file(classes_file)
    return ClassList(
        synsets,
        f"the class file {classes_file}",
        _FILE_CONVENTION.format(last=len(synsets) - 1, count=len(synsets), path=classes_file),
    )


def parse_class_list(text: str) -> tuple[str, ...]:
    """The wnids of a class file's text, in order.

    Raises:
      ValueError: a line that is not an ILSVRC2012 synset, a synset listed twice, or fewer than 2 synsets;
        the message names the line.
    """
    known = schema.synset_to_label()
    synsets: list[str] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        wnid = line.strip()
        if not wnid or wnid.startswith("#"):
            continue
        if wnid not in known:
            raise ValueError(f"line {number}: {wnid!r} is not an ILSVRC2012 synset (one wnid a line)")
        if wnid in first_line:
            raise ValueError(f"line {number}: {wnid} is listed twice (first on line {first_line[wnid]})")
        first_line[wnid] = number
        synsets.append(wnid)
    if len(synsets) < 2:
        raise ValueError(f"lists {len(synsets)} synset(s): a classifier needs at least 2")
    return tuple(synsets)


def read_class_file(path: str) -> tuple[str, ...]:
    """The wnids of the class file at ``path`` (any Beam file system), in label order.

    Raises:
      ValueError: the file does not parse (see ``parse_class_list``), naming the file.
    """
    try:
        return parse_class_list(storage.read_text(path))
    except ValueError as e:  # a UnicodeDecodeError too
        raise ValueError(f"classes_file {path}: {e}") from None
