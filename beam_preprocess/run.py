"""Runs the sharding pipeline on any Beam runner and enforces the failure budget afterwards."""

from __future__ import annotations

import dataclasses
import json

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_preprocess import pipeline, schema, storage
from beam_preprocess.config import ShardingConfig


class FailureBudgetExceeded(RuntimeError):
    """More inputs failed than ``max_failures`` allows; the message lists them all."""


class OutputExistsError(RuntimeError):
    """The output directory holds an earlier run's shards and overwrite was not asked for."""


def failure_report(manifest: dict, limit: int = 50) -> str:
    failures = manifest["failures"]
    lines = [f"  {f['split']}: {f['source']}: {f['reason']}" for f in failures[:limit]]
    if len(failures) > limit:
        lines.append(f"  ... and {len(failures) - limit} more (all are in manifest.json)")
    return "\n".join(lines)


def check_failure_budget(manifest: dict, max_failures: int, manifest_path: str) -> None:
    failures = manifest["failures"]
    if len(failures) > max_failures:
        raise FailureBudgetExceeded(
            f"{len(failures)} inputs could not be used (more than --max-failures={max_failures}); "
            f"they are listed in {manifest_path}:\n{failure_report(manifest)}"
        )


def prepare_output_dir(config: ShardingConfig) -> None:
    """Refuses to mix with an earlier run's shards, or clears them when ``overwrite`` is set."""
    stale = [config.manifest_path] if storage.exists(config.manifest_path) else []
    for split in schema.SPLITS:
        stale += storage.glob(storage.join(config.split_dir(split), f"{split}-*-of-*"))
    if not stale:
        return
    if not config.overwrite:
        raise OutputExistsError(
            f"{config.output_dir} already holds {len(stale)} files of an earlier run (e.g. {stale[0]}); "
            "pass --overwrite to replace them, or choose another --output-dir"
        )
    storage.remove(stale)


@dataclasses.dataclass
class RunResult:
    manifest: dict
    counters: dict[str, int]

    def split_records(self) -> dict[str, int]:
        return {split: info["records"] for split, info in self.manifest["splits"].items()}

    def report(self, seconds: float) -> str:
        lines = [f"beam_preprocess finished in {seconds:.1f}s"]
        for split, info in self.manifest["splits"].items():
            fixed = ", ".join(f"{k} {v}" for k, v in info["fixed"].items() if v) or "none"
            lines.append(
                f"  {split}: read {info['read']}, written {info['records']} in {info['num_shards']} shards "
                f"({info['bytes'] / 2**20:.1f} MiB), failed {info['failed']}, fixed: {fixed}"
            )
        if self.counters:
            lines.append("  counters: " + ", ".join(f"{k}={v}" for k, v in sorted(self.counters.items())))
        if self.manifest["failures"]:
            lines.append(f"  {len(self.manifest['failures'])} failures:\n{failure_report(self.manifest)}")
        return "\n".join(lines)


def query_counters(result) -> dict[str, int]:
    try:
        metrics = result.metrics().query(beam.metrics.MetricsFilter().with_namespace(pipeline.NAMESPACE))
    except (NotImplementedError, AttributeError):  # some runners do not report metrics
        return {}
    return {m.key.metric.name: m.committed for m in metrics["counters"]}


def run(config: ShardingConfig, beam_args: list[str] | None = None) -> RunResult:
    """Runs the pipeline to completion, then raises FailureBudgetExceeded if too many inputs failed."""
    prepare_output_dir(config)
    options = PipelineOptions(beam_args or [])
    p = beam.Pipeline(options=options)
    _ = p | "ShardImageNet" >> pipeline.ShardImageNet(config)
    result = p.run()
    result.wait_until_finish()
    manifest = json.loads(storage.read_text(config.manifest_path))
    check_failure_budget(manifest, config.max_failures, config.manifest_path)
    return RunResult(manifest, query_counters(result))
