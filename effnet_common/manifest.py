"""manifest.json: the data contract between the sharding run and everything that reads its shards.

One frozen dataclass tree, written by ``beam_preprocess`` and read by the TFX component, the runners and the
trainer. ``to_json`` / ``from_json`` are pure (no file system, no TensorFlow, no Beam), so the trainer can
read the text with ``tf.io.gfile`` on any TensorFlow file system (``ram://`` included, which Beam does not
know) and parse it here; ``read`` / ``write`` go through ``effnet_common.storage`` (Beam FileSystems).

Shard paths are written relative to the manifest's directory, so a copied dataset stays readable; in memory
they are resolved against the directory the manifest was read from (``Manifest.directory``), so
``manifest.split("train").shards[0].path`` is a path a reader can open.

Format history (``manifest_version``): version 1 is the only one. Fields added since it was first written
(``label_offset``, ``num_classes``, ``synsets``) are optional on reading, so manifests of earlier runs still
parse: without ``synsets`` the classes are the 1000 ILSVRC2012 synsets in sorted order.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Mapping
from typing import Any

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
FORMAT_TFRECORD = "tfrecord"
COMPRESSION_NONE = "none"
IMAGENET_CLASSES = 1000


class ManifestError(ValueError):
    """manifest.json is malformed, inconsistent, or of a version this code does not read."""


@dataclasses.dataclass(frozen=True)
class Shard:
    """One TFRecord file: its path (resolved, see the module doc), records and bytes."""

    path: str
    records: int
    bytes: int


@dataclasses.dataclass(frozen=True, order=True)
class Failure:
    """One input that could not be used, and why."""

    split: str
    source: str
    reason: str


@dataclasses.dataclass(frozen=True)
class LabelConvention:
    """How ``image/class/label`` maps to synsets: label = offset + index of the synset in the class list.

    ``synsets`` is that list in label order when it is not ImageNet's (a run with ``classes=found`` or a class
    file); None means the 1000 ILSVRC2012 synsets, sorted (``class_synsets`` resolves either).
    """

    description: str
    offset: int = 0
    num_classes: int = IMAGENET_CLASSES
    synsets: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.synsets is not None:
            if len(self.synsets) != self.num_classes:
                raise ManifestError(f"num_classes {self.num_classes} but {len(self.synsets)} synsets listed")
            if len(set(self.synsets)) != len(self.synsets):
                raise ManifestError("a synset is listed twice among the classes")
        elif self.num_classes != IMAGENET_CLASSES:
            raise ManifestError(
                f"num_classes {self.num_classes} without the synsets list (only ImageNet's "
                f"{IMAGENET_CLASSES} classes go without one)"
            )

    def class_synsets(self) -> tuple[str, ...]:
        """The synsets in label order: the listed ones, or the 1000 ILSVRC2012 synsets."""
        if self.synsets is not None:
            return self.synsets
        from effnet_common import schema  # reads the list tensorflow-datasets ships, only when asked

        return schema.synsets()


@dataclasses.dataclass(frozen=True)
class SplitManifest:
    """One split: what was read, written and failed, the shards in order, and the images per class."""

    name: str
    read: int
    records: int
    failed: int
    bytes: int
    directory: str  # relative to the manifest's directory
    file_pattern: str  # relative to the manifest's directory
    shards: tuple[Shard, ...]
    fixed: Mapping[str, int] = dataclasses.field(default_factory=dict)
    class_counts: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.read != self.records + self.failed:
            raise ManifestError(
                f"split {self.name}: read {self.read} inputs but lists {self.records} records and "
                f"{self.failed} failures"
            )
        in_shards = sum(s.records for s in self.shards)
        if in_shards != self.records:
            raise ManifestError(f"split {self.name}: {self.records} records but its shards hold {in_shards}")

    @property
    def num_examples(self) -> int:
        """The split's epoch size: records written."""
        return self.records

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def shard_paths(self) -> list[str]:
        return [s.path for s in self.shards]


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything a sharding run wrote. ``directory`` (where manifest.json lives) is not part of the JSON."""

    splits: Mapping[str, SplitManifest]
    label_convention: LabelConvention
    feature_keys: tuple[str, ...]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    failures: tuple[Failure, ...] = ()
    format: str = FORMAT_TFRECORD
    compression: str = COMPRESSION_NONE
    version: int = MANIFEST_VERSION
    directory: str = dataclasses.field(default="", compare=False)

    def split(self, name: str) -> SplitManifest:
        """The split ``name``; raises ManifestError naming the splits there are."""
        try:
            return self.splits[name]
        except KeyError:
            where = posixpath.join(self.directory, MANIFEST_NAME) if self.directory else "the manifest"
            raise ManifestError(
                f"{where} has no split {name!r} (it has: {', '.join(self.splits) or 'none'})"
            ) from None

    def num_examples(self, split: str) -> int:
        return self.split(split).num_examples

    def to_json(self) -> str:
        """The manifest.json text; shard paths under ``directory`` are written relative to it."""
        labels = self.label_convention
        values = {
            "manifest_version": self.version,
            "format": self.format,
            "compression": self.compression,
            "feature_keys": list(self.feature_keys),
            "label_convention": labels.description,
            "label_offset": labels.offset,
            "num_classes": labels.num_classes,
            "options": dict(self.options),
            "splits": {name: _split_to_dict(s, self.directory) for name, s in self.splits.items()},
            "failures": [dataclasses.asdict(f) for f in self.failures],
        }
        if labels.synsets is not None:  # ImageNet's 1000 go without a list (older manifests have none)
            values["synsets"] = list(labels.synsets)
        return json.dumps(values, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, directory: str = "", source: str = "") -> Manifest:
        """Parses manifest.json text; relative shard paths are resolved against ``directory``.

        Args:
          text: the file's contents.
          directory: where the file lives ("" keeps the paths as written).
          source: the file's path, for error messages (default: ``directory/manifest.json``).

        Raises:
          ManifestError: not JSON, a field missing or of the wrong type, counts that disagree, or a newer
            version; the message names the file.
        """
        where = source or (posixpath.join(directory, MANIFEST_NAME) if directory else MANIFEST_NAME)
        try:
            values = json.loads(text)
            version = int(values.get("manifest_version", 0))
            if version != MANIFEST_VERSION:
                raise ManifestError(
                    f"manifest_version {version} is not read here (expected {MANIFEST_VERSION})"
                )
            return cls(
                splits={
                    name: _split_from_dict(name, info, directory) for name, info in values["splits"].items()
                },
                label_convention=LabelConvention(
                    description=str(values["label_convention"]),
                    offset=int(values.get("label_offset", 0)),
                    num_classes=int(values.get("num_classes", IMAGENET_CLASSES)),
                    synsets=_synsets(values.get("synsets")),
                ),
                feature_keys=tuple(values["feature_keys"]),
                options=dict(values.get("options", {})),
                failures=tuple(Failure(f["split"], f["source"], f["reason"]) for f in values["failures"]),
                format=str(values["format"]),
                compression=str(values["compression"]),
                version=version,
                directory=directory,
            )
        except ManifestError as e:
            raise ManifestError(f"{where}: {e}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ManifestError(
                f"{where} is not a beam_preprocess manifest: {type(e).__name__}: {e}"
            ) from None

    @classmethod
    def read(cls, path: str) -> Manifest:
        """Reads ``path`` (a manifest.json, on any Beam file system)."""
        from effnet_common import storage

        return cls.from_json(storage.read_text(path), directory=storage.dirname(path), source=path)

    def write(self, path: str) -> None:
        """Writes manifest.json at ``path`` as one whole object (atomically on local disks)."""
        from effnet_common import storage

        storage.write_text(path, self.to_json())


def _synsets(listed) -> tuple[str, ...] | None:
    if listed is None:
        return None
    if not isinstance(listed, list) or not all(isinstance(wnid, str) for wnid in listed):
        raise ManifestError(f"synsets must be a list of wnids, got {listed!r:.80}")
    return tuple(listed)


def _relative(path: str, directory: str) -> str:
    prefix = directory.rstrip("/") + "/"
    return path[len(prefix) :] if directory and path.startswith(prefix) else path


def _resolved(path: str, directory: str) -> str:
    if not directory or "://" in path or path.startswith("/"):
        return path
    return posixpath.join(directory, path)


def _split_to_dict(split: SplitManifest, directory: str) -> dict:
    return {
        "read": split.read,
        "records": split.records,
        "failed": split.failed,
        "fixed": dict(split.fixed),
        "bytes": split.bytes,
        "num_shards": split.num_shards,
        "directory": split.directory,
        "file_pattern": split.file_pattern,
        "shards": [
            {"path": _relative(s.path, directory), "records": s.records, "bytes": s.bytes}
            for s in split.shards
        ],
        "class_counts": dict(split.class_counts),
    }


def _split_from_dict(name: str, info: Mapping, directory: str) -> SplitManifest:
    shards = tuple(
        Shard(_resolved(str(s["path"]), directory), int(s["records"]), int(s["bytes"]))
        for s in info["shards"]
    )
    if int(info.get("num_shards", len(shards))) != len(shards):
        raise ManifestError(f"split {name}: num_shards {info['num_shards']} but {len(shards)} shards listed")
    return SplitManifest(
        name=name,
        read=int(info["read"]),
        records=int(info["records"]),
        failed=int(info["failed"]),
        bytes=int(info["bytes"]),
        directory=str(info["directory"]),
        file_pattern=str(info["file_pattern"]),
        shards=shards,
        fixed={k: int(v) for k, v in info.get("fixed", {}).items()},
        class_counts={k: int(v) for k, v in info.get("class_counts", {}).items()},
    )
