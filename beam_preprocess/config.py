"""The one config of the sharding stage, shared by the CLI and the TFX component (JSON round trip)."""

from __future__ import annotations

import dataclasses
import json
import re

from beam_preprocess import classes as class_lists
from beam_preprocess import sources
from effnet_common import schema, storage

# The inputs that give each split its images (a tensorflow-datasets copy gives both).
SPLIT_INPUTS = {
    schema.TRAIN: ("train_archive", "train_dir", "tfds_data_dir"),
    schema.VALIDATION: ("val_archive", "val_dir", "tfds_data_dir"),
}


def with_flag_names(message: str) -> str:
    """``message`` with each ``ShardingConfig`` field it names written as the command-line flag that sets it
    (``shard_mb`` -> ``--shard-mb``): the line a person reads names what they typed. Only the names of more
    than one word are taken for fields (``seed`` and ``classes`` are words of the messages too)."""
    names = [field.name for field in dataclasses.fields(ShardingConfig) if "_" in field.name]
    for name in sorted(names, key=len, reverse=True):
        message = re.sub(rf"(?<![\w.-]){name}(?!\w)", "--" + name.replace("_", "-"), message)
    return message


def splits_without_input(inputs) -> list[str]:
    """The splits (of ``schema.SPLITS``) that none of ``inputs`` (a mapping of input names to paths, or a
    ``ShardingConfig``) gives images."""

    def given(name: str) -> bool:
        return bool(inputs.get(name) if hasattr(inputs, "get") else getattr(inputs, name))

    return [split for split in schema.SPLITS if not any(given(name) for name in SPLIT_INPUTS[split])]


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
    """Inputs, output layout and budgets of one sharding run.

    Attributes:
      output_dir: where ``<split>/<split>-NNNNN-of-MMMMM`` shards and ``manifest.json`` are written.
      train_archive / val_archive: ``ILSVRC2012_img_train.tar`` (inner per-synset tars) and
        ``ILSVRC2012_img_val.tar`` (flat, labelled by the list tensorflow-datasets ships).
      train_dir / val_dir: the extracted layout, ``train/<wnid>/*.JPEG``; validation either ``val/<wnid>/``
        or flat with official file names.
      tfds_data_dir: a tensorflow-datasets data_dir holding a prepared ``imagenet2012``, resharded here.
      num_hosts: every split's shard count is a multiple of this (one input pipeline per host).
      train_shards / val_shards: explicit shard counts (0 = derive from ``shard_mb``).
      shard_mb: target shard size in MiB when the count is derived.
      max_failures: inputs that may fail before the run exits non-zero (they are listed either way).
      seed: seed of the training split's shuffle (validation keeps sorted order).
      members_per_unit: validation archive members (or flat-directory files) one worker reads at a time.
        Small enough that the last units of the checking stage end together (a unit runs on one core), large
        enough that a unit's fixed costs (a spill file, an element) stay small.
      check_threads: threads each worker process decodes images on (0 = one per core of the machine it runs
        on); the output is the same for any number (``beam_preprocess.threads``).
      worker_processes: processes of the run's own that Beam's workers hand each work unit and shard to
        (``beam_preprocess.processes``). None: the run decides
        (``beam_preprocess.run.resolve_worker_processes``: one per core when the DirectRunner's workers are
        threads of one process, else 0); 0: none, Beam's workers do the work. The output is the same for any
        number.
      split_dir_template: directory of a split's shards under ``output_dir`` (``Split-{split}`` for TFX).
      overwrite: replace shards and manifest left by an earlier run in ``output_dir``.
      classes: what the labels number (``beam_preprocess.classes``): 'imagenet' (the 1000 ILSVRC2012 synsets,
        labels 0..999), 'found' (the sorted synsets of the training input, labels 0..K-1; needs a training
        archive or directory) or 'file' (the synsets of ``classes_file`` in its order). An image whose
        synset is not a class is a failure.
      classes_file: with ``classes='file'``: one wnid a line, in label order (any Beam file system).
    """

    output_dir: str
    train_archive: str = ""
    val_archive: str = ""
    train_dir: str = ""
    val_dir: str = ""
    tfds_data_dir: str = ""
    num_hosts: int = 1
    train_shards: int = 0
    val_shards: int = 0
    shard_mb: float = 128.0
    max_failures: int = 0
    seed: int = 0
    members_per_unit: int = 250
    check_threads: int = 0
    worker_processes: int | None = None
    split_dir_template: str = "{split}"
    overwrite: bool = False
    classes: str = class_lists.IMAGENET
    classes_file: str = ""

    def __post_init__(self):
        if not self.output_dir:
            raise ValueError("output_dir is required")
        if self.num_hosts < 1:
            raise ValueError(f"num_hosts must be >= 1, got {self.num_hosts}")
        for name in ("train_shards", "val_shards"):
            count = getattr(self, name)
            if count < 0 or count % self.num_hosts:
                raise ValueError(
                    f"{name}={count} must be a multiple of num_hosts={self.num_hosts} (or 0 to derive)"
                )
        if self.shard_mb <= 0:
            raise ValueError(f"shard_mb must be positive, got {self.shard_mb}")
        if self.max_failures < 0:
            raise ValueError(f"max_failures must be >= 0, got {self.max_failures}")
        if self.members_per_unit < 1:
            raise ValueError(f"members_per_unit must be >= 1, got {self.members_per_unit}")
        if self.check_threads < 0:
            raise ValueError(f"check_threads must be >= 0 (0 = one per core), got {self.check_threads}")
        if self.worker_processes is not None and self.worker_processes < 0:
            raise ValueError(
                "worker_processes must be >= 0 (0 = none; unset = one per core on the DirectRunner's "
                f"threads), got {self.worker_processes}"
            )
        if "{split}" not in self.split_dir_template:
            raise ValueError(f"split_dir_template {self.split_dir_template!r} must contain '{{split}}'")
        if self.train_archive and self.train_dir:
            raise ValueError("give train_archive or train_dir, not both")
        if self.val_archive and self.val_dir:
            raise ValueError("give val_archive or val_dir, not both")
        if self.tfds_data_dir and (self.train_archive or self.train_dir or self.val_archive or self.val_dir):
            raise ValueError(
                "tfds_data_dir replaces the archive and directory inputs: give one kind of input"
            )
        if not self.input_specs():
            raise ValueError("no input: give train/val archives, train/val directories, or tfds_data_dir")
        self._check_classes()

    def _check_classes(self) -> None:
        class_lists.CLASS_LISTS.check(self.classes)
        if (self.classes == class_lists.FILE) != bool(self.classes_file):
            raise ValueError(
                f"classes='file' goes with classes_file (got classes={self.classes!r}, "
                f"classes_file={self.classes_file!r})"
            )
        if self.classes == class_lists.FOUND and not (self.train_archive or self.train_dir):
            raise ValueError(
                "classes='found' takes the classes from the training input's <wnid>.tar members or <wnid>/ "
                "directories: give train_archive or train_dir (a tensorflow-datasets imagenet2012 holds "
                "ImageNet's 1000 classes: classes='imagenet')"
            )

    def input_specs(self) -> list[sources.InputSpec]:
        specs = []
        if self.train_archive:
            specs.append(sources.InputSpec(schema.TRAIN, sources.KIND_TRAIN_ARCHIVE, self.train_archive))
        if self.train_dir:
            specs.append(sources.InputSpec(schema.TRAIN, sources.KIND_SYNSET_DIR, self.train_dir))
        if self.val_archive:
            specs.append(sources.InputSpec(schema.VALIDATION, sources.KIND_VAL_ARCHIVE, self.val_archive))
        if self.val_dir:
            specs.append(sources.InputSpec(schema.VALIDATION, sources.KIND_VAL_DIR, self.val_dir))
        if self.tfds_data_dir:
            for split in schema.SPLITS:
                specs.append(sources.InputSpec(split, sources.KIND_TFDS, self.tfds_data_dir))
        return specs

    def requested_shards(self, split: str) -> int:
        return self.train_shards if split == schema.TRAIN else self.val_shards

    def split_dir(self, split: str) -> str:
        return storage.join(self.output_dir, self.split_dir_template.format(split=split))

    @property
    def manifest_path(self) -> str:
        return storage.join(self.output_dir, "manifest.json")

    @property
    def temp_dir(self) -> str:
        return storage.join(self.output_dir, ".beam_preprocess-tmp")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ShardingConfig:
        values = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ShardingConfig fields {unknown}; known: {sorted(known)}")
        return cls(**values)
