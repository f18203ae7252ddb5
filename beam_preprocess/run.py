"""Runs the sharding pipeline on any Beam runner and enforces the failure budget afterwards."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil

import apache_beam as beam

from beam_preprocess import lean_imports, pipeline, processes
from beam_preprocess.config import ShardingConfig
from effnet_common import console, dataflow_jobs, schema, stopping, storage
from effnet_common.manifest import Manifest


class FailureBudgetExceeded(RuntimeError):
    """More inputs failed than ``max_failures`` allows; the message lists them all."""


class OutputExistsError(RuntimeError):
    """The output directory holds an earlier run's shards and overwrite was not asked for."""


def pipeline_from_args(beam_args: list[str]) -> beam.Pipeline:
    """The Beam pipeline of Beam options ``beam_args``, on the runner and in the mode they name, as Beam
    builds it; on Dataflow, Ctrl-C (or SIGTERM) cancels its job
    (``effnet_common.dataflow_jobs.StoppablePipeline``)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return dataflow_jobs.StoppablePipeline(options=PipelineOptions(beam_args))


def failure_report(manifest: Manifest, limit: int = 50) -> str:
    failures = manifest.failures
    lines = [f"  {f.split}: {f.source}: {f.reason}" for f in failures[:limit]]
    if len(failures) > limit:
        lines.append(f"  ... and {len(failures) - limit} more (all are in manifest.json)")
    return "\n".join(lines)


# What a run over its failure budget leaves instead of manifest.json: the failures, under a name no reader of
# finished output looks for (its shards are deleted).
FAILED_MANIFEST_NAME = "manifest.failed.json"
# Inputs named on the console line of a run over its failure budget (all are in the failed manifest).
NAMED_FAILURES = 3


def failed_manifest_path(config: ShardingConfig) -> str:
    return storage.join(config.output_dir, FAILED_MANIFEST_NAME)


def check_failure_budget(manifest: Manifest, max_failures: int, manifest_path: str) -> None:
    """Raises when more inputs failed than ``max_failures``: the first line names the first few inputs and
    their reasons, the lines after it list up to 50."""
    if len(manifest.failures) > max_failures:
        first = "; ".join(f"{f.source}: {f.reason}" for f in manifest.failures[:NAMED_FAILURES])
        more = len(manifest.failures) - NAMED_FAILURES
        raise FailureBudgetExceeded(
            f"{len(manifest.failures)} inputs could not be used (more than --max-failures={max_failures}): "
            f"{first}{f' and {more} more' if more > 0 else ''}; all are listed in {manifest_path}\n"
            f"{failure_report(manifest)}"
        )


def written_shards(config: ShardingConfig) -> list[str]:
    """The shard files of both splits under the output directory."""
    return [
        path
        for split in schema.SPLITS
        for path in storage.glob(storage.join(config.split_dir(split), f"{split}-*-of-*"))
    ]


def discard_failed_output(config: ShardingConfig) -> str:
    """Deletes the shards of a run over its failure budget and renames its manifest to
    ``FAILED_MANIFEST_NAME``, so no later step takes the output for a finished one; returns that path."""
    failed = failed_manifest_path(config)
    storage.write_text(failed, storage.read_text(config.manifest_path))
    storage.remove([config.manifest_path, *written_shards(config)])
    return failed


def prepare_output_dir(config: ShardingConfig) -> None:
    """Refuses to mix with an earlier run's output (shards, manifest, spill files), or clears it on
    ``overwrite``."""
    stale = [p for p in (config.manifest_path, failed_manifest_path(config)) if storage.exists(p)]
    stale += written_shards(config)
    spill = storage.list_tree(config.temp_dir)
    if not stale and not spill:
        return
    if not config.overwrite:
        example = (stale or spill)[0]
        raise OutputExistsError(
            f"{config.output_dir} already holds {len(stale) + len(spill)} files of an earlier run "
            f"(e.g. {example}); pass --overwrite to replace them, or choose another --output-dir"
        )
    storage.remove(stale)
    if spill:
        storage.remove_tree(config.temp_dir)


def remove_partial_output(config: ShardingConfig) -> None:
    """Deletes what a run stopped half-way wrote: its spill files and its shards and manifest (the output
    directory held none before it: ``prepare_output_dir``)."""
    storage.remove_tree(config.temp_dir)
    written = [p for p in (config.manifest_path,) if storage.exists(p)]
    storage.remove(written + written_shards(config))


def leftovers_message(config: ShardingConfig) -> str:
    """The one line a failed run prints: where its partial output and spill files are."""
    return (
        f"beam_preprocess did not finish: its spill files are left under {config.temp_dir} and any shards "
        f"written under {config.output_dir}; rerun with --overwrite to replace them, or delete them"
    )


# The DirectRunner's modes whose workers are threads of the command's process (``in_memory``: one thread).
THREAD_MODES = ("multi_threading", "in_memory")


def resolve_worker_processes(config: ShardingConfig, options) -> int:
    """The worker processes of the run (``config.worker_processes``, or when unset: one per core if Beam's
    workers are threads of this process, the DirectRunner's ``multi_threading`` and ``in_memory`` modes;
    else 0, as on Dataflow, whose workers are processes of their own, one per core)."""
    if config.worker_processes is not None:
        return config.worker_processes
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    runner = options.view_as(StandardOptions).runner
    if runner is not None and not isinstance(runner, str):
        runner = type(runner).__name__
    on_threads = options.view_as(DirectOptions).direct_running_mode in THREAD_MODES
    return (
        os.cpu_count() or 1 if (runner is None or runner in lean_imports.DIRECT_RUNNERS) and on_threads else 0
    )


def run_pipeline(beam_pipeline: beam.Pipeline, config: ShardingConfig, worker_processes: int = 0):
    """Adds ShardImageNet to ``beam_pipeline``, runs it to completion and returns the Beam result.

    A run that fails logs one line naming its leftovers before the error propagates.
    """
    _ = beam_pipeline | "ShardImageNet" >> pipeline.ShardImageNet(config, worker_processes)
    try:
        result = beam_pipeline.run()
        result.wait_until_finish()
    except BaseException:
        logging.error("%s", leftovers_message(config))
        raise
    return result


@dataclasses.dataclass
class RunResult:
    manifest: Manifest
    counters: dict[str, int]

    def split_records(self) -> dict[str, int]:
        return {split: info.records for split, info in self.manifest.splits.items()}

    def report(self, seconds: float) -> str:
        lines = [f"beam_preprocess finished in {seconds:.1f}s"]
        for split, info in self.manifest.splits.items():
            fixed = ", ".join(f"{k} {v}" for k, v in info.fixed.items() if v) or "none"
            lines.append(
                f"  {split}: read {info.read}, written {info.records} in "
                f"{console.plural(info.num_shards, 'shard')} "
                f"({info.bytes / 2**20:.1f} MiB), failed {info.failed}, fixed: {fixed}"
            )
        if self.counters:
            lines.append("  counters: " + ", ".join(f"{k}={v}" for k, v in sorted(self.counters.items())))
        if self.manifest.failures:
            lines.append(f"  {len(self.manifest.failures)} failures:\n{failure_report(self.manifest)}")
        return "\n".join(lines)


def query_counters(result) -> dict[str, int]:
    try:
        metrics = result.metrics().query(beam.metrics.MetricsFilter().with_namespace(pipeline.NAMESPACE))
    except (NotImplementedError, AttributeError):  # some runners do not report metrics
        return {}
    return {m.key.metric.name: m.committed for m in metrics["counters"]}


def run(
    config: ShardingConfig, beam_args: list[str] | None = None, beam_pipeline: beam.Pipeline | None = None
) -> RunResult:
    """The one entry point of a sharding run (the CLI's and the TFX executor's).

    Prepares the output directory, runs ShardImageNet to completion in ``beam_pipeline`` (the TFX executor
    passes the one TFX configured) or in a new pipeline with ``beam_args``, and reads the manifest.

    Raises:
      OutputExistsError: the output holds an earlier run's files and ``config.overwrite`` is off.
      FailureBudgetExceeded: more inputs failed than ``config.max_failures``.
    """
    prepare_output_dir(config)
    if beam_pipeline is None:
        beam_pipeline = pipeline_from_args(beam_args or [])
    # Ctrl-C ends the command without unwinding this (``effnet_common.stopping``): nothing half-written stays,
    # nor the local temporary directory Beam made for the pipeline (it removes it when a run ends).
    local_tempdir = beam_pipeline.local_tempdir
    worker_processes = resolve_worker_processes(config, beam_pipeline.options)
    with (
        stopping.cleanup(lambda: shutil.rmtree(local_tempdir, ignore_errors=True)),
        stopping.cleanup(lambda: remove_partial_output(config)),
    ):
        try:
            if worker_processes:
                # Started now, the processes import what they need while Beam builds and starts the pipeline;
                # the DoFns of this process find them ready (``processes.shared_pool``).
                processes.shared_pool(worker_processes)
            result = run_pipeline(beam_pipeline, config, worker_processes)
        finally:
            processes.close_shared_pools()
    manifest = Manifest.read(config.manifest_path)
    if len(manifest.failures) > config.max_failures:
        check_failure_budget(manifest, config.max_failures, discard_failed_output(config))
    return RunResult(manifest, query_counters(result))
