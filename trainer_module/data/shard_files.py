"""The shard files of a run: listing them, dealing them out to the input pipelines (one per host), and their
record counts and classes from the manifest ``beam_preprocess`` wrote beside them."""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from effnet_common.manifest import MANIFEST_NAME, Manifest
from trainer_module import files

FilePatterns = str | Sequence[str]


GLOB_CHARACTERS = re.compile(r"[*?\[]")


def list_files(file_patterns: FilePatterns) -> list[str]:
    """Every file matching ``file_patterns`` (one glob or a list, as TFX passes ``fn_args.train_files``),
    sorted and without duplicates, so every host computes the same list.

    A name without glob characters is taken as it is, without asking the filesystem: a list already expanded
    (1,024 training shards on ``gs://``) costs no further listing; a missing file fails when it is read.

    Raises:
      ValueError: a pattern matches no file.
    """
    patterns = [file_patterns] if isinstance(file_patterns, str) else list(file_patterns)
    if not patterns:
        raise ValueError("file_patterns is empty: give at least one glob of TFRecord shards")
    files = set()
    for pattern in patterns:
        if not GLOB_CHARACTERS.search(pattern):
            files.add(pattern)
            continue
        matched = tf.io.gfile.glob(pattern)
        if not matched:
            raise ValueError(f"file pattern {pattern!r} matches no file")
        files.update(matched)
    return sorted(files)


def _context(input_context: tf.distribute.InputContext | None) -> tf.distribute.InputContext:
    # None: a single pipeline feeding a single replica (tests, benchmarks, plain Keras).
    return input_context or tf.distribute.InputContext()


def replicas_per_pipeline(input_context: tf.distribute.InputContext) -> int:
    """Replicas fed by each input pipeline (num_replicas_in_sync / num_input_pipelines)."""
    replicas, pipelines = input_context.num_replicas_in_sync, input_context.num_input_pipelines
    if replicas % pipelines:
        raise ValueError(
            f"num_replicas_in_sync={replicas} is not a multiple of num_input_pipelines={pipelines}: "
            "every input pipeline must feed the same number of replicas"
        )
    return replicas // pipelines


def pipeline_files(files: Sequence[str], num_input_pipelines: int, input_pipeline_id: int) -> list[str]:
    """The files input pipeline ``input_pipeline_id`` reads: every ``num_input_pipelines``-th from its id.

    Same rule as ``Dataset.shard`` on the sorted file list, in plain Python so the evaluation plan can count
    every pipeline's records.

    Raises:
      ValueError: the pipeline would get no file (fewer files than input pipelines).
    """
    own = list(files[input_pipeline_id::num_input_pipelines])
    if not own:
        raise ValueError(
            f"input pipeline {input_pipeline_id} of {num_input_pipelines} gets no file: only {len(files)} "
            f"files for {num_input_pipelines} input pipelines; write at least as many shards as hosts "
            "(beam_preprocess --num-hosts)"
        )
    return own


def _normalised(path: str) -> str:
    return path if "://" in path else os.path.normpath(os.path.abspath(path))


def read_manifest(manifest_path: str) -> Manifest:
    """The beam_preprocess manifest at ``manifest_path``, read by ``tf.io.gfile`` (gs://, ram://, local)."""
    return Manifest.from_json(
        files.read_text(manifest_path), directory=posixpath.dirname(manifest_path), source=manifest_path
    )


def manifest_path_of(shard_path: str) -> str:
    """Where the manifest of a shard sits: in the parent of its split directory."""
    return posixpath.join(posixpath.dirname(posixpath.dirname(shard_path)), MANIFEST_NAME)


def _manifest_counts(manifest_path: str) -> dict[str, tuple[int, int]]:
    """Path -> (records, bytes) of every shard a beam_preprocess manifest lists."""
    manifest = read_manifest(manifest_path)
    if manifest.compression != "none":
        raise ValueError(
            f"{manifest_path}: compression {manifest.compression!r} is not read here (expected 'none')"
        )
    return {
        _normalised(shard.path): (shard.records, shard.bytes)
        for split in manifest.splits.values()
        for shard in split.shards
    }


def _count_records(path: str) -> int:
    return int(tf.data.TFRecordDataset(path).reduce(np.int64(0), lambda count, _: count + 1))


def record_counts(files: Sequence[str]) -> list[int]:
    """Records in each file: from ``manifest.json`` beside the split directory, else by reading the file.

    The manifest of a ``beam_preprocess`` run sits in the parent of the shards' directory. Its counts are
    used only for files it lists with their exact current size; counting a file reads it end to end, fine for
    small data, too slow for ImageNet on every host.

    Raises:
      ValueError: a manifest exists but does not list a file, or lists it with another size (shards
        replaced since the manifest was written).
    """
    manifests: dict[str, dict[str, tuple[int, int]] | None] = {}
    counts = []
    for path in files:
        manifest_path = manifest_path_of(path)
        if manifest_path not in manifests:
            exists = tf.io.gfile.exists(manifest_path)
            manifests[manifest_path] = _manifest_counts(manifest_path) if exists else None
        listed = manifests[manifest_path]
        if listed is None:
            counts.append(_count_records(path))
            continue
        entry = listed.get(_normalised(path))
        if entry is None:
            raise ValueError(
                f"{path} is not listed in {manifest_path}: the split directory holds other files"
            )
        records, size = entry
        actual = tf.io.gfile.stat(path).length
        if actual != size:
            raise ValueError(
                f"{path} has {actual} bytes but {manifest_path} lists {size}: the manifest is stale"
            )
        counts.append(records)
    return counts


def shard_classes(file_patterns: FilePatterns) -> tuple[str, ...] | None:
    """The shards' classes in label order, from their manifests; None where no manifest sits beside them.

    A beam_preprocess manifest names its classes (``LabelConvention.class_synsets``: ImageNet's 1000, or the
    synsets of a run with ``--classes found``/a class file); the classifier's width and the label check
    follow them. Shards of several manifests must agree on them.

    Raises:
      ValueError: two manifests of the files list different classes (both named).
    """
    found: dict[str, tuple[str, ...]] = {}
    for path in list_files(file_patterns):
        manifest_path = manifest_path_of(path)
        if manifest_path in found or not tf.io.gfile.exists(manifest_path):
            continue
        found[manifest_path] = read_manifest(manifest_path).label_convention.class_synsets()
    if not found:
        return None
    (first, classes), *others = found.items()
    for other, other_classes in others:
        if other_classes != classes:
            raise ValueError(
                f"{other} lists {len(other_classes)} classes and {first} {len(classes)} (or the same in "
                "another order): the shards read together must share one label numbering"
            )
    return classes


def num_examples(file_patterns: FilePatterns) -> int:
    """Records in all the files: the manifest's counts where the shards have one (see ``record_counts``)."""
    return sum(record_counts(list_files(file_patterns)))
