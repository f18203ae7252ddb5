"""The Beam pipeline: inputs -> checked tf.train.Examples -> balanced, deterministic shards + manifest.

Stages (each a small DoFn with counters, composed by one ``ptransform_fn``):

1. ``PlanUnitsFn``: one input (archive, directory, tfds dir) -> work units, reading tar headers only.
2. ``ProcessUnitFn``: one unit -> every image decoded, fixed if needed, turned into an Example and appended to
   a per-unit spill file; only small metadata (sort key, spill offset) travels on. Image bytes never cross a
   shuffle, so memory does not grow with the dataset even on the DirectRunner.
3. ``assign_shards``: per split, sort the metadata (seeded hash for train, file name for validation) and cut
   it into contiguous runs whose lengths differ by at most one.
4. ``WriteShardFn``: one shard -> its records read back from the spill files, written in order.
5. ``WriteManifestFn``: counts, shards, classes, failures -> manifest.json; checks read = written + failed.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import time
import typing

import apache_beam as beam
from apache_beam.metrics import Metrics

from beam_preprocess import images, schema, sources, storage, tfrecord
from beam_preprocess.config import ShardingConfig

NAMESPACE = "beam_preprocess"
MANIFEST_VERSION = 1


class ImageMeta(typing.NamedTuple):
    """What travels after an image is processed: where its Example waits in a spill file."""

    sort_key: str
    filename: str
    synset: str
    spill_path: str
    offset: int
    length: int


class Failure(typing.NamedTuple):
    split: str
    source: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ShardTask:
    split: str
    index: int
    count: int
    records: tuple[tuple[str, int, int], ...]  # (spill path, offset, length) in output order


def train_sort_key(seed: int, filename: str) -> str:
    """A seeded pseudo-random but reproducible position for a training image."""
    return hashlib.sha256(f"{seed}:{filename}".encode()).hexdigest()[:24] + "|" + filename


class PlanUnitsFn(beam.DoFn):
    def __init__(self, members_per_unit: int):
        self._members_per_unit = members_per_unit
        self._units = Metrics.counter(NAMESPACE, "work_units")

    def process(self, spec: sources.InputSpec):
        start = time.time()
        count = 0
        for unit in sources.plan_units(spec, self._members_per_unit):
            count += 1
            self._units.inc()
            yield unit
        logging.info("planned %d work units from %s (%.1fs)", count, spec.path, time.time() - start)


class ProcessUnitFn(beam.DoFn):
    """Reads, checks and fixes every image of a unit; spills Examples to one file per unit."""

    FAILURES = "failures"
    STATS = "stats"

    def __init__(self, temp_dir: str, seed: int):
        self._temp_dir = temp_dir
        self._seed = seed
        self._read = Metrics.counter(NAMESPACE, "images_read")
        self._written = Metrics.counter(NAMESPACE, "images_processed")
        self._failed = Metrics.counter(NAMESPACE, "images_failed")
        self._bytes_read = Metrics.counter(NAMESPACE, "bytes_read")
        self._fixed = {kind: Metrics.counter(NAMESPACE, f"fixed_{kind}") for kind in images.FIX_KINDS}

    def process(self, unit: sources.WorkUnit):
        start = time.time()
        spill_dir = storage.join(self._temp_dir, unit.split)
        storage.makedirs(spill_dir)
        spill_path = storage.join(spill_dir, f"{unit.unit_id}.examples")
        stats = collections.Counter()
        metas = []
        failures = []
        offset = 0
        with storage.open_write(spill_path + ".inprogress") as spill:
            for item in sources.read_unit(unit):
                stats["read"] += 1
                self._read.inc()
                if item.error is None:
                    self._bytes_read.inc(len(item.data))
                    try:
                        checked = images.check_and_fix(item.data)
                    except images.BadImageError as e:
                        item = dataclasses.replace(item, data=None, error=str(e))
                if item.error is not None:
                    stats["failed"] += 1
                    self._failed.inc()
                    failures.append(Failure(item.split, item.source, item.error))
                    continue
                if checked.fix != images.FIX_NONE:
                    stats[f"fixed_{checked.fix}"] += 1
                    self._fixed[checked.fix].inc()
                record = images.build_example(checked, item.filename, item.synset)
                spill.write(record)
                sort_key = (
                    item.filename
                    if unit.split == schema.VALIDATION
                    else train_sort_key(self._seed, item.filename)
                )
                metas.append(ImageMeta(sort_key, item.filename, item.synset, spill_path, offset, len(record)))
                offset += len(record)
                stats["processed"] += 1
                self._written.inc()
        storage.rename(spill_path + ".inprogress", spill_path)
        logging.info(
            "%s: %d images, %d fixed, %d failed (%.1fs)",
            unit.description,
            stats["read"],
            sum(v for k, v in stats.items() if k.startswith("fixed_")),
            stats["failed"],
            time.time() - start,
        )
        for meta in metas:
            yield unit.split, meta
        for failure in failures:
            yield beam.pvalue.TaggedOutput(self.FAILURES, failure)
        yield beam.pvalue.TaggedOutput(self.STATS, (unit.split, dict(stats)))


def choose_num_shards(total_bytes: int, requested: int, shard_mb: float, num_hosts: int) -> int:
    """The requested count, or enough shards of about ``shard_mb`` MiB, rounded up to a multiple of hosts."""
    if requested:
        return requested
    by_size = -(-total_bytes // int(shard_mb * 2**20))
    return max(num_hosts, -(-by_size // num_hosts) * num_hosts)


def balanced_bounds(num_records: int, num_shards: int) -> list[tuple[int, int]]:
    """[start, end) of each shard: contiguous runs whose lengths differ by at most one."""
    return [(num_records * i // num_shards, num_records * (i + 1) // num_shards) for i in range(num_shards)]


def assign_shards(split_and_metas, config: ShardingConfig):
    """Sorts one split's metadata and cuts it into balanced shards; also yields the split summary."""
    split, metas = split_and_metas
    metas = sorted(metas)
    total_bytes = sum(m.length for m in metas)
    count = choose_num_shards(total_bytes, config.requested_shards(split), config.shard_mb, config.num_hosts)
    for index, (start, end) in enumerate(balanced_bounds(len(metas), count)):
        run = tuple((m.spill_path, m.offset, m.length) for m in metas[start:end])
        yield ShardTask(split, index, count, run)
    class_counts = collections.Counter(m.synset for m in metas)
    yield beam.pvalue.TaggedOutput("summaries", (split, {"class_counts": dict(sorted(class_counts.items()))}))


class WriteShardFn(beam.DoFn):
    """Writes one shard's records, in order, from the spill files to a TFRecord file (atomically)."""

    def __init__(self, config: ShardingConfig):
        self._config = config
        self._written = Metrics.counter(NAMESPACE, "images_written")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_written")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")

    def process(self, task: ShardTask):
        split_dir = self._config.split_dir(task.split)
        storage.makedirs(split_dir)
        path = storage.join(split_dir, schema.shard_name(task.split, task.index, task.count))
        handles = {}
        size = 0
        try:
            with storage.open_write(path + ".inprogress") as out:
                for spill_path, offset, length in task.records:
                    f = handles.get(spill_path)
                    if f is None:
                        f = handles[spill_path] = storage.open_read(spill_path)
                    f.seek(offset)
                    record = f.read(length)
                    if len(record) != length:
                        raise OSError(f"spill file {spill_path} is cut short at offset {offset}")
                    framed = tfrecord.frame_record(record)
                    out.write(framed)
                    size += len(framed)
        finally:
            for f in handles.values():
                f.close()
        storage.rename(path + ".inprogress", path)
        self._written.inc(len(task.records))
        self._bytes.inc(size)
        self._shards.inc()
        yield {
            "split": task.split,
            "index": task.index,
            "path": path if storage.is_remote(path) else os.path.relpath(path, self._config.output_dir),
            "records": len(task.records),
            "bytes": size,
        }


class WriteManifestFn(beam.DoFn):
    """Writes manifest.json once every shard is written, checks that nothing was lost, removes spill files."""

    def __init__(self, config: ShardingConfig):
        self._config = config

    def process(self, _, shards, failures, stats, summaries):
        manifest = build_manifest(self._config, shards, failures, stats, summaries)
        storage.write_text(self._config.manifest_path, json.dumps(manifest, indent=2, sort_keys=True))
        storage.remove_tree(self._config.temp_dir)
        yield manifest


def build_manifest(config: ShardingConfig, shards, failures, stats, summaries) -> dict:
    """The manifest of a run; raises if any split's read count differs from written + failed."""
    totals = {split: collections.Counter() for split in schema.SPLITS}
    for split, unit_stats in stats:
        totals[split].update(unit_stats)
    summary_by_split = dict(summaries)
    splits = {}
    for split in schema.SPLITS:
        split_shards = sorted((s for s in shards if s["split"] == split), key=lambda s: s["index"])
        written = sum(s["records"] for s in split_shards)
        read, failed = totals[split]["read"], totals[split]["failed"]
        if read != written + failed:
            raise RuntimeError(
                f"{split}: read {read} inputs but wrote {written} and failed {failed}: records lost"
            )
        if not read:
            continue
        splits[split] = {
            "read": read,
            "records": written,
            "failed": failed,
            "fixed": {kind: totals[split][f"fixed_{kind}"] for kind in images.FIX_KINDS},
            "bytes": sum(s["bytes"] for s in split_shards),
            "num_shards": len(split_shards),
            "directory": config.split_dir_template.format(split=split),
            "file_pattern": f"{config.split_dir_template.format(split=split)}/{split}-*-of-*",
            "shards": [{k: s[k] for k in ("path", "records", "bytes")} for s in split_shards],
            "class_counts": summary_by_split.get(split, {}).get("class_counts", {}),
        }
    return {
        "manifest_version": MANIFEST_VERSION,
        "format": "tfrecord",
        "compression": "none",
        "feature_keys": list(schema.FEATURE_KEYS),
        "label_convention": schema.LABEL_CONVENTION,
        "options": dataclasses.asdict(config),
        "splits": splits,
        "failures": [f._asdict() for f in sorted(failures)],
    }


@beam.ptransform_fn
def ShardImageNet(root, config: ShardingConfig):  # noqa: N802 - Beam transforms are named like classes
    """ImageNet inputs -> balanced TFRecord shards under ``config.output_dir``; yields the manifest dict."""
    processed = (
        root
        | "Inputs" >> beam.Create(config.input_specs())
        | "PlanUnits" >> beam.ParDo(PlanUnitsFn(config.members_per_unit))
        | "SpreadUnits" >> beam.Reshuffle()
        | "ProcessUnits"
        >> beam.ParDo(ProcessUnitFn(config.temp_dir, config.seed)).with_outputs(
            ProcessUnitFn.FAILURES, ProcessUnitFn.STATS, main="metas"
        )
    )
    assigned = (
        processed.metas
        | "GroupBySplit" >> beam.GroupByKey()
        | "AssignShards" >> beam.FlatMap(assign_shards, config).with_outputs("summaries", main="tasks")
    )
    shards = (
        assigned.tasks
        | "SpreadShards" >> beam.Reshuffle()
        | "WriteShards" >> beam.ParDo(WriteShardFn(config))
    )
    as_list = beam.pvalue.AsList
    return (
        root
        | "ManifestTrigger" >> beam.Create([None])
        | "WriteManifest"
        >> beam.ParDo(
            WriteManifestFn(config),
            as_list(shards),
            as_list(processed[ProcessUnitFn.FAILURES]),
            as_list(processed[ProcessUnitFn.STATS]),
            as_list(assigned.summaries),
        )
    )
