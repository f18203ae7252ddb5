"""The Beam pipeline: inputs -> checked tf.train.Examples -> balanced, deterministic shards + manifest.

Stages (each a small DoFn with counters, composed by one ``ptransform_fn``):

1. ``PlanUnitsFn``: one input (archive, directory, tfds dir) -> work units, reading tar headers only. The
   class list (``beam_preprocess.classes``: ImageNet's 1000, the training units' synsets, or a class file)
   is built once planning is done and goes to the next stages as a side input.
2. ``ProcessUnitFn``: one unit -> every image decoded, fixed if needed, and described in the unit's spill file
   (``beam_preprocess.spill``: where an untouched image sits in its archive and the Example's bytes around it,
   or the bytes of a re-encoded one), indexed in the unit's output order; what travels on is one ``UnitSpill``
   per unit (a few numbers).
3. ``build_layout``: per split, the units in order and numbered by prefix sums, which fixes every record's shard
   (``beam_preprocess.layout``).
4. ``WriteShardFn``: one shard index -> its records found from the layout, their index entries read from the
   spill files and their images from the archives by exact byte ranges (bytes read = bytes needed), each
   checked against the CRC taken at step 2, written in order.
5. ``WriteManifestFn``: counts, shards, classes, failures -> manifest.json; checks read = written + failed;
   deletes the spill files.

Only per-unit and per-shard elements of a fixed size cross a stage boundary. Runners may hold a stage's whole
output in memory (the DirectRunner does, and copies side inputs into every worker), so one element per image,
a split's records grouped on one key, or even per-image offsets in a side input would make memory grow with
the dataset; per-image offsets stay in the spill files instead.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import time

import apache_beam as beam
from apache_beam.metrics import Metrics

from beam_preprocess import images, layout, sources, spill, threads
from beam_preprocess.classes import CLASS_LISTS, ClassList, imagenet_classes
from beam_preprocess.config import ShardingConfig
from effnet_common import schema, storage
from effnet_common.manifest import Failure, Manifest, Shard, SplitManifest

NAMESPACE = "beam_preprocess"


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


def training_synsets(unit: sources.WorkUnit) -> list[str]:
    """The synset of a training unit that names one (an inner ``<wnid>.tar`` or a ``<wnid>/`` directory)."""
    return [unit.synset] if unit.split == schema.TRAIN and unit.synset else []


def build_class_list(config: ShardingConfig, found: list[str]) -> ClassList:
    """The run's classes by ``config.classes``, given the synsets of the planned training units."""
    return CLASS_LISTS.build(config.classes, config.classes_file, found)


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


class ProcessUnitFn(beam.DoFn):
    """Reads, checks and fixes every image of a unit; describes its records in one spill file per unit.

    Images are checked on ``check_threads`` threads (``beam_preprocess.threads``) while this thread reads the
    unit and writes the spill; counters are updated once per unit.
    """

    FAILURES = "failures"
    STATS = "stats"

    def __init__(self, temp_dir: str, seed: int, check_threads: int = 0):
        self._temp_dir = temp_dir
        self._seed = seed
        self._check_threads = check_threads
        self._read = Metrics.counter(NAMESPACE, "images_read")
        self._written = Metrics.counter(NAMESPACE, "images_processed")
        self._failed = Metrics.counter(NAMESPACE, "images_failed")
        self._bytes_read = Metrics.counter(NAMESPACE, "bytes_read")
        self._spilled = Metrics.counter(NAMESPACE, "spill_bytes_written")
        self._fixed = {kind: Metrics.counter(NAMESPACE, f"fixed_{kind}") for kind in images.FIX_KINDS}

    def setup(self):
        self._threads = self._check_threads or threads.default_threads()  # the cores of the worker's machine

    def process(self, unit: sources.WorkUnit, classes: ClassList | None = None):
        """``classes``: the run's class list (side input); None is ImageNet's 1000."""
        classes = classes or imagenet_classes()
        start = time.time()
        spill_path = storage.join(self._temp_dir, unit.split, f"{unit.unit_id}.spill")
        stats = collections.Counter()
        class_counts = collections.Counter()
        failures = []
        bytes_read = 0
        with storage.open_write(spill_path) as f:
            writer = spill.SpillWriter(f)
            for item, (checked, error) in threads.ordered_map(
                check_item, of_the_classes(sources.read_unit(unit), classes), self._threads
            ):
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
                    self._order_key(unit.split, item.filename),
                    images.example_pieces(checked, item.filename, item.synset, classes.labels[item.synset]),
                    checked.jpeg,
                    item.at if untouched else None,  # an untouched image is read again from its archive
                )
                class_counts[item.synset] += 1
                stats["processed"] += 1
            written = writer.finish()
        self._count(stats, bytes_read, written.spill_bytes)
        logging.info(
            "%s: %d images, %d fixed, %d failed (%.1fs)",
            unit.description,
            stats["read"],
            sum(v for k, v in stats.items() if k.startswith("fixed_")),
            stats["failed"],
            time.time() - start,
        )
        if written.keys:
            yield layout.UnitSpill(
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
        for failure in failures:
            yield beam.pvalue.TaggedOutput(self.FAILURES, failure)
        yield beam.pvalue.TaggedOutput(self.STATS, (unit.split, dict(stats), dict(class_counts)))

    def _count(self, stats: collections.Counter, bytes_read: int, bytes_spilled: int) -> None:
        self._read.inc(stats["read"])
        self._written.inc(stats["processed"])
        self._failed.inc(stats["failed"])
        self._bytes_read.inc(bytes_read)
        self._spilled.inc(bytes_spilled)
        for kind, counter in self._fixed.items():
            counter.inc(stats[f"fixed_{kind}"])

    def _order_key(self, split: str, filename: str) -> str:
        return filename if split == schema.VALIDATION else train_sort_key(self._seed, filename)


def build_layouts(spills: list[layout.UnitSpill], config: ShardingConfig) -> dict[str, layout.SplitLayout]:
    """The layout of every split that has a usable record."""
    layouts = {}
    for split in schema.SPLITS:
        split_spills = [s for s in spills if s.split == split]
        if split_spills:
            layouts[split] = layout.build_layout(
                split,
                split_spills,
                config.requested_shards(split),
                config.shard_mb,
                config.num_hosts,
                config.seed,
            )
    return layouts


def shard_tasks(layouts: dict[str, layout.SplitLayout]):
    """One (split, shard index) per shard to write."""
    for split, split_layout in layouts.items():
        for index in range(split_layout.num_shards):
            yield split, index


class WriteShardFn(beam.DoFn):
    """Writes one shard: its records located through the layout, read from the spills and archives, in order."""

    def __init__(self, config: ShardingConfig):
        self._config = config
        self._written = Metrics.counter(NAMESPACE, "images_written")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_written")
        self._reread = Metrics.counter(NAMESPACE, "bytes_reread")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")

    def process(self, task: tuple[str, int], layouts: dict[str, layout.SplitLayout]):
        split, index = task
        split_layout = layouts[split]
        name = schema.shard_name(split, index, split_layout.num_shards)
        path = storage.join(self._config.split_dir(split), name)
        reads = [(split_layout.units[k], ranks) for k, ranks in split_layout.shard_reads(index)]
        read_threads = storage.read_threads({p for unit, _ in reads for p in (unit.path, unit.source)})
        records = size = 0
        with storage.open_write(path) as out, spill.RecordReader(read_threads) as reader:
            for unit, entry, image in reader.shard_records(reads, keep_order=split_layout.sorted_by_name):
                size += spill.write_record(out, entry, image, unit.source)
                records += 1
        self._reread.inc(reader.bytes_read)
        self._written.inc(records)
        self._bytes.inc(size)
        self._shards.inc()
        yield {"split": split, "index": index, "path": path, "records": records, "bytes": size}


class WriteManifestFn(beam.DoFn):
    """Writes manifest.json once every shard is written, checks that nothing was lost, deletes the spill."""

    def __init__(self, config: ShardingConfig):
        self._config = config

    def process(self, _, shards, failures, stats, classes: ClassList):
        manifest = build_manifest(self._config, shards, failures, stats, classes)
        manifest.write(self._config.manifest_path)
        removed = storage.remove_tree(self._config.temp_dir)
        logging.info("deleted %d spill files under %s", removed, self._config.temp_dir)
        yield manifest


def build_manifest(
    config: ShardingConfig, shards, failures, stats, class_list: ClassList | None = None
) -> Manifest:
    """The manifest of a run (``class_list`` None: ImageNet's); raises if any split's read count differs from
    written + failed."""
    totals = {split: collections.Counter() for split in schema.SPLITS}
    classes = {split: collections.Counter() for split in schema.SPLITS}
    for split, unit_stats, unit_classes in stats:
        totals[split].update(unit_stats)
        classes[split].update(unit_classes)
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
        directory = config.split_dir_template.format(split=split)
        splits[split] = SplitManifest(
            name=split,
            read=read,
            records=written,
            failed=failed,
            bytes=sum(s["bytes"] for s in split_shards),
            directory=directory,
            file_pattern=f"{directory}/{split}-*-of-*",
            shards=tuple(Shard(s["path"], s["records"], s["bytes"]) for s in split_shards),
            fixed={kind: totals[split][f"fixed_{kind}"] for kind in images.FIX_KINDS},
            class_counts=dict(sorted(classes[split].items())),
        )
    return Manifest(
        splits=splits,
        label_convention=(class_list or imagenet_classes()).label_convention(),
        feature_keys=tuple(schema.FEATURE_KEYS),
        options=dataclasses.asdict(config),
        failures=tuple(sorted(failures)),
        directory=config.output_dir,
    )


@beam.ptransform_fn
def ShardImageNet(root, config: ShardingConfig):  # noqa: N802 - Beam transforms are named like classes
    """ImageNet inputs -> balanced TFRecord shards under ``config.output_dir``; yields the ``Manifest``."""
    units = (
        root
        | "Inputs" >> beam.Create(config.input_specs())
        | "PlanUnits" >> beam.ParDo(PlanUnitsFn(config.members_per_unit))
    )
    classes = beam.pvalue.AsSingleton(
        units
        | "TrainingSynsets" >> beam.FlatMap(training_synsets)
        | "DistinctSynsets" >> beam.Distinct()
        | "CollectSynsets" >> beam.combiners.ToList()
        | "ClassList" >> beam.Map(lambda found: build_class_list(config, found))
    )
    processed = (
        units
        | "SpreadUnits" >> beam.Reshuffle()
        | "ProcessUnits"
        >> beam.ParDo(
            ProcessUnitFn(config.temp_dir, config.seed, config.check_threads), classes
        ).with_outputs(ProcessUnitFn.FAILURES, ProcessUnitFn.STATS, main="spills")
    )
    as_list = beam.pvalue.AsList
    layouts = (
        root
        | "LayoutTrigger" >> beam.Create([None])
        | "Layout" >> beam.Map(lambda _, spills: build_layouts(spills, config), as_list(processed.spills))
    )
    shards = (
        layouts
        | "ShardTasks" >> beam.FlatMap(shard_tasks)
        | "SpreadShards" >> beam.Reshuffle()
        | "WriteShards" >> beam.ParDo(WriteShardFn(config), beam.pvalue.AsSingleton(layouts))
    )
    return (
        root
        | "ManifestTrigger" >> beam.Create([None])
        | "WriteManifest"
        >> beam.ParDo(
            WriteManifestFn(config),
            as_list(shards),
            as_list(processed[ProcessUnitFn.FAILURES]),
            as_list(processed[ProcessUnitFn.STATS]),
            classes,
        )
    )
