"""The two pieces of work a sharding run is made of, as plain functions of plain data: one work unit checked
and spilled, one shard written. No Beam here, so that the same calls run inside a Beam worker or on a process
of ``beam_preprocess.processes`` (which imports this module ahead of time, with Beam's file systems).

- ``process_unit``: every image of a unit read, decoded, fixed if needed and described in the unit's spill
  file (``beam_preprocess.spill``), in the unit's output order; what comes back is a few numbers and the
  failures.
- ``write_shard``: one shard's records found through the layout, their index entries read from the spills
  and their images from the archives by exact byte ranges, each checked against the CRC taken when it was
  checked, written in order.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import time

from beam_preprocess import images, layout, sources, spill, threads
from beam_preprocess.classes import ClassList, imagenet_classes
from effnet_common import schema, storage
from effnet_common.manifest import Failure


def train_sort_key(seed: int, filename: str) -> str:
    """A seeded pseudo-random but reproducible position for a training image."""
    return hashlib.sha256(f"{seed}:{filename}".encode()).hexdigest()[:24] + "|" + filename


def order_key(split: str, seed: int, filename: str) -> str:
    """A record's place in its unit: its name (validation) or its seeded hash key (training)."""
    return filename if split == schema.VALIDATION else train_sort_key(seed, filename)


def of_the_classes(items, classes: ClassList):
    """``items``, those whose synset is not one of ``classes`` turned into failures saying so."""
    for item in items:
        if item.error is None and item.synset not in classes.labels:
            item = dataclasses.replace(item, data=None, error=classes.not_a_class(item.synset))
        yield item


def check_item(item: sources.InputItem) -> tuple[images.CheckedImage | None, str | None]:
    """(checked image, None) for an image that decodes, else (None, why not); runs on a check thread."""
    if item.error is not None:
        return None, item.error
    try:
        return images.check_and_fix(item.data), None
    except images.BadImageError as e:
        return None, str(e)


@dataclasses.dataclass(frozen=True)
class UnitTask:
    """One unit to check and spill. ``classes``: the run's class list (None: ImageNet's 1000); ``threads``:
    the threads its images are decoded on (1: the calling thread only)."""

    unit: sources.WorkUnit
    temp_dir: str
    seed: int
    threads: int = 1
    classes: ClassList | None = None


@dataclasses.dataclass(frozen=True)
class UnitOutcome:
    """What checking one unit found: its spill (None when no record of it is usable), its failures, its counts
    (read, processed, failed, fixed_<kind>) and images per class."""

    unit: sources.WorkUnit
    spill: layout.UnitSpill | None
    failures: tuple[Failure, ...]
    stats: dict[str, int]
    class_counts: dict[str, int]
    bytes_read: int
    spill_bytes: int
    seconds: float

    @property
    def fixed(self) -> int:
        return sum(v for k, v in self.stats.items() if k.startswith("fixed_"))


def process_unit(task: UnitTask) -> UnitOutcome:
    """Reads, checks and fixes every image of ``task.unit`` and describes its records in one spill file."""
    start = time.time()
    unit = task.unit
    classes = task.classes or imagenet_classes()
    spill_path = storage.join(task.temp_dir, unit.split, f"{unit.unit_id}.spill")
    stats = collections.Counter()
    class_counts = collections.Counter()
    failures = []
    bytes_read = 0
    with storage.open_write(spill_path) as f:
        writer = spill.SpillWriter(f)
        items = of_the_classes(sources.read_unit(unit), classes)
        for item, (checked, error) in threads.ordered_map(check_item, items, task.threads):
            stats["read"] += 1
            if item.error is None:
                bytes_read += len(item.data)
            if error is not None:
                stats["failed"] += 1
                failures.append(Failure(item.split, item.source, error))
                continue
            if checked.fix != images.FIX_NONE:
                stats[f"fixed_{checked.fix}"] += 1
            untouched = checked.jpeg is item.data
            writer.add(
                order_key(unit.split, task.seed, item.filename),
                images.example_pieces(checked, item.filename, item.synset, classes.labels[item.synset]),
                checked.jpeg,
                item.at if untouched else None,  # an untouched image is read again from its archive
            )
            class_counts[item.synset] += 1
            stats["processed"] += 1
        written = writer.finish()
    unit_spill = None
    if written.keys:
        unit_spill = layout.UnitSpill(
            split=unit.split,
            path=spill_path,
            order_key=written.keys[0],
            count=len(written.keys),
            num_bytes=written.record_bytes,
            keys=tuple(written.keys) if unit.split == schema.VALIDATION else (),
            source=unit.path,
            index_at=written.index_at,
            entry_size=written.entry_size,
        )
    return UnitOutcome(
        unit=unit,
        spill=unit_spill,
        failures=tuple(failures),
        stats=dict(stats),
        class_counts=dict(class_counts),
        bytes_read=bytes_read,
        spill_bytes=written.spill_bytes,
        seconds=time.time() - start,
    )


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One shard to write: its path, the (unit, ranks) of its records in order, and whether the ranks of a
    unit keep the order given (validation: by name) or may be read in file order (training)."""

    split: str
    index: int
    path: str
    reads: tuple[tuple[layout.UnitSpill, tuple[int, ...]], ...]
    keep_order: bool


def shard_task(split_layout: layout.SplitLayout, index: int, path: str) -> ShardTask:
    """The task of shard ``index`` of ``split_layout``: only the units it reads, without their names (which a
    shard writer never needs), so that the task stays small whatever the split's size."""
    reads = tuple(
        (split_layout.units[k]._replace(keys=()), tuple(ranks))
        for k, ranks in split_layout.shard_reads(index)
    )
    return ShardTask(split_layout.split, index, path, reads, keep_order=split_layout.sorted_by_name)


@dataclasses.dataclass(frozen=True)
class ShardOutcome:
    """One written shard: where, how many records and bytes, and the bytes read to write it."""

    split: str
    index: int
    path: str
    records: int
    bytes: int
    bytes_reread: int
    seconds: float

    def as_row(self) -> dict:
        """The shard as the manifest's stage receives it."""
        return {
            "split": self.split,
            "index": self.index,
            "path": self.path,
            "records": self.records,
            "bytes": self.bytes,
        }


def write_shard(task: ShardTask) -> ShardOutcome:
    """Writes one shard whole (``storage.open_write``): its records read, checked and written in order."""
    start = time.time()
    reads = [(unit, list(ranks)) for unit, ranks in task.reads]
    read_threads = storage.read_threads({p for unit, _ in reads for p in (unit.path, unit.source)})
    records = size = 0
    with storage.open_write(task.path) as out, spill.RecordReader(read_threads) as reader:
        for unit, entry, image in reader.shard_records(reads, keep_order=task.keep_order):
            size += spill.write_record(out, entry, image, unit.source)
            records += 1
    return ShardOutcome(
        task.split, task.index, task.path, records, size, reader.bytes_read, time.time() - start
    )
