"""The Beam pipeline: inputs -> checked tf.train.Examples -> balanced, deterministic shards + manifest.

1. ``PlanUnitsFn``: one input -> work units, from tar headers only; then the class list (side input).
2. ``ProcessUnitFn``: one unit -> every image decoded, fixed if needed and described in the unit's spill file
   (``beam_preprocess.spill``), indexed in output order; one ``UnitSpill`` (a few numbers) travels on.
3. ``build_layout`` (``beam_preprocess.layout``): per split, the units ordered and numbered by prefix sums,
   which fixes every record's shard.
4. ``WriteShardFn``: one shard -> its records' index entries read from the spills and their images from the
   archives by exact byte ranges, each checked against the CRC of step 2, written in order.
5. ``WriteManifestFn``: counts, failures -> manifest.json; checks read = written + failed; deletes the spill.

Steps 2 and 4 are plain functions (``beam_preprocess.work``), run in the DoFn or on worker processes
(``beam_preprocess.processes``). Only fixed-size per-unit and per-shard elements cross a stage: the
DirectRunner holds a stage's output in memory and copies side inputs into every worker, so anything per
image would grow memory with the dataset (docs/sharding.md).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from beam_preprocess import images, layout, processes, sources, threads, work
from beam_preprocess.classes import CLASS_LISTS, ClassList, imagenet_classes
from beam_preprocess.config import ShardingConfig
from effnet_common import schema, storage
from effnet_common.manifest import Manifest, Shard, SplitManifest

NAMESPACE = "beam_preprocess"


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


class _Offloaded:
    """The tasks a DoFn instance has in flight on a worker process pool during one bundle, oldest first.

    A Beam worker thread hands its elements out one after the other; keeping up to the pool's size of them in
    flight lets one thread keep every process busy once the other threads have finished their part of a stage
    (the DirectRunner splits a stage's input once between its workers). Results come back in the order the
    elements came, those not yet yielded by ``process`` at the bundle's end from ``finish_bundle``.
    """

    def __init__(self, pool: processes.Pool | None):
        self.pool = pool
        self._pending: collections.deque = collections.deque()

    def submit(self, fn, task) -> Iterator:
        """Submits ``fn(task)``; yields the results that are done, waiting for the oldest beyond the limit."""
        self._pending.append(self.pool.submit(fn, task))
        while self._pending and (len(self._pending) > self.pool.size or self._pending[0].done()):
            yield self._pending.popleft().result()

    def drain(self) -> Iterator:
        while self._pending:
            yield self._pending.popleft().result()


def _windowed(output):
    """An output yielded by ``finish_bundle``, which must carry its window: the global one (every element of
    these stages is in it)."""
    if isinstance(output, beam.pvalue.TaggedOutput):
        return beam.pvalue.TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))
    return GlobalWindows.windowed_value(output)


class ProcessUnitFn(beam.DoFn):
    """Reads, checks and fixes every image of a unit; describes its records in one spill file per unit
    (``beam_preprocess.work.process_unit``).

    With ``worker_processes`` > 0 each unit goes whole to a process of the worker's pool
    (``beam_preprocess.processes``); otherwise its images are checked on ``check_threads`` threads
    (``beam_preprocess.threads``) while this thread reads the unit and writes the spill. Counters are updated
    once per unit.
    """

    FAILURES = "failures"
    STATS = "stats"

    def __init__(self, temp_dir: str, seed: int, check_threads: int = 0, worker_processes: int = 0):
        self._temp_dir = temp_dir
        self._seed = seed
        self._check_threads = check_threads
        self._processes = worker_processes
        self._read = Metrics.counter(NAMESPACE, "images_read")
        self._written = Metrics.counter(NAMESPACE, "images_processed")
        self._failed = Metrics.counter(NAMESPACE, "images_failed")
        self._bytes_read = Metrics.counter(NAMESPACE, "bytes_read")
        self._spilled = Metrics.counter(NAMESPACE, "spill_bytes_written")
        self._fixed = {kind: Metrics.counter(NAMESPACE, f"fixed_{kind}") for kind in images.FIX_KINDS}

    def setup(self):
        self._threads = self._check_threads or threads.default_threads()  # the cores of the worker's machine
        pool = processes.shared_pool(self._processes) if self._processes else None
        self._offloaded = _Offloaded(pool)

    def start_bundle(self):
        self._offloaded = _Offloaded(self._offloaded.pool)

    def process(self, unit: sources.WorkUnit, classes: ClassList | None = None):
        """``classes``: the run's class list (side input); None is ImageNet's 1000."""
        if self._offloaded.pool is None:
            task = work.UnitTask(unit, self._temp_dir, self._seed, self._threads, classes)
            yield from self._outputs(work.process_unit(task))
            return
        task = work.UnitTask(unit, self._temp_dir, self._seed, 1, classes)
        for outcome in self._offloaded.submit(work.process_unit, task):
            yield from self._outputs(outcome)

    def finish_bundle(self):
        for outcome in self._offloaded.drain():
            for output in self._outputs(outcome):
                yield _windowed(output)

    def _outputs(self, outcome: work.UnitOutcome):
        stats = collections.Counter(outcome.stats)
        self._read.inc(stats["read"])
        self._written.inc(stats["processed"])
        self._failed.inc(stats["failed"])
        self._bytes_read.inc(outcome.bytes_read)
        self._spilled.inc(outcome.spill_bytes)
        for kind, counter in self._fixed.items():
            counter.inc(stats[f"fixed_{kind}"])
        logging.info(
            "%s: %d images, %d fixed, %d failed (%.1fs)",
            outcome.unit.description,
            stats["read"],
            outcome.fixed,
            stats["failed"],
            outcome.seconds,
        )
        if outcome.spill is not None:
            yield outcome.spill
        for failure in outcome.failures:
            yield beam.pvalue.TaggedOutput(self.FAILURES, failure)
        yield beam.pvalue.TaggedOutput(self.STATS, (outcome.unit.split, outcome.stats, outcome.class_counts))


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


def shard_path(config: ShardingConfig, split_layout: layout.SplitLayout, index: int) -> str:
    """Where shard ``index`` of a split is written."""
    name = schema.shard_name(split_layout.split, index, split_layout.num_shards)
    return storage.join(config.split_dir(split_layout.split), name)


def shard_tasks(layouts: dict[str, layout.SplitLayout]):
    """One (split, shard index) per shard to write."""
    for split, split_layout in layouts.items():
        for index in range(split_layout.num_shards):
            yield split, index


class WriteShardFn(beam.DoFn):
    """Writes one shard: its records located through the layout, read from the spills and archives, in
    order (``beam_preprocess.work.write_shard``; with ``worker_processes`` > 0 on a process of the worker's
    pool)."""

    def __init__(self, config: ShardingConfig, worker_processes: int = 0):
        self._config = config
        self._processes = worker_processes
        self._written = Metrics.counter(NAMESPACE, "images_written")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_written")
        self._reread = Metrics.counter(NAMESPACE, "bytes_reread")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")

    def setup(self):
        self._offloaded = _Offloaded(processes.shared_pool(self._processes) if self._processes else None)

    def start_bundle(self):
        self._offloaded = _Offloaded(self._offloaded.pool)

    def process(self, task: tuple[str, int], layouts: dict[str, layout.SplitLayout]):
        split, index = task
        split_layout = layouts[split]
        shard = work.shard_task(split_layout, index, shard_path(self._config, split_layout, index))
        if self._offloaded.pool is None:
            yield self._output(work.write_shard(shard))
            return
        for outcome in self._offloaded.submit(work.write_shard, shard):
            yield self._output(outcome)

    def finish_bundle(self):
        for outcome in self._offloaded.drain():
            yield _windowed(self._output(outcome))

    def _output(self, outcome: work.ShardOutcome) -> dict:
        self._reread.inc(outcome.bytes_reread)
        self._written.inc(outcome.records)
        self._bytes.inc(outcome.bytes)
        self._shards.inc()
        logging.info("%s: %d records (%.1fs)", outcome.path, outcome.records, outcome.seconds)
        return outcome.as_row()


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


# Named like a class, as Beam transforms are (hence N802).
@beam.ptransform_fn
def ShardImageNet(root, config: ShardingConfig, worker_processes: int = 0):  # noqa: N802
    """ImageNet inputs -> balanced TFRecord shards under ``config.output_dir``; yields the ``Manifest``.

    ``worker_processes``: the processes each Beam worker hands its units and shards to
    (``beam_preprocess.processes``; 0: the Beam workers do the work themselves).
    """
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
            ProcessUnitFn(config.temp_dir, config.seed, config.check_threads, worker_processes), classes
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
        | "WriteShards"
        >> beam.ParDo(WriteShardFn(config, worker_processes), beam.pvalue.AsSingleton(layouts))
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
