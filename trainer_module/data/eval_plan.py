"""The evaluation plan: equal step counts on every input pipeline, every validation record counted once.

Collectives need every replica of every host to run the same number of evaluation steps, so each pipeline pads
its records with masked examples up to a common count.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from trainer_module.data.shard_files import (
    FilePatterns,
    _context,
    list_files,
    pipeline_files,
    record_counts,
    replicas_per_pipeline,
)


@dataclasses.dataclass(frozen=True)
class EvalPlan:
    """How one evaluation pass is laid out over the input pipelines.

    Attributes:
      steps: evaluation steps of one pass, the same on every replica of every host.
      num_examples: real validation examples in all (the sum of the masks over a pass).
      per_replica_batch_size: examples per replica per step, padding included.
      replicas_per_pipeline: replicas each input pipeline feeds.
      pipeline_examples: real examples read by each input pipeline, by pipeline id.
    """

    steps: int
    num_examples: int
    per_replica_batch_size: int
    replicas_per_pipeline: int
    pipeline_examples: tuple[int, ...]

    @property
    def per_pipeline_batch_size(self) -> int:
        return self.per_replica_batch_size * self.replicas_per_pipeline

    @property
    def examples_per_pipeline(self) -> int:
        """Examples (real and padding) each pipeline yields per pass."""
        return self.steps * self.per_pipeline_batch_size

    @property
    def num_padding(self) -> int:
        """Padding examples over all pipelines per pass."""
        return self.examples_per_pipeline * len(self.pipeline_examples) - self.num_examples


def eval_plan(
    file_patterns: FilePatterns,
    global_batch_size: int,
    input_context: tf.distribute.InputContext | None = None,
) -> EvalPlan:
    """The evaluation step count and example count for ``build_eval_dataset`` with the same arguments.

    steps = ceil(max over pipelines of that pipeline's records / per-pipeline batch), where per-pipeline
    batch = per-replica batch x replicas fed by a pipeline. Only ``num_input_pipelines`` and
    ``num_replicas_in_sync`` of the context matter, so the training loop can build one itself.

    Args:
      file_patterns: glob(s) of the validation shards.
      global_batch_size: evaluation examples per step over all replicas.
      input_context: as passed to the dataset function; None is one pipeline feeding one replica.

    Raises:
      ValueError: batch not divisible by the replicas, replicas not a multiple of the input pipelines, fewer
        files than input pipelines, no records at all, or a stale manifest.
    """
    ctx = _context(input_context)
    per_replica = ctx.get_per_replica_batch_size(global_batch_size)
    replicas = replicas_per_pipeline(ctx)
    files = list_files(file_patterns)
    counts = dict(zip(files, record_counts(files), strict=True))
    pipeline_examples = tuple(
        sum(counts[f] for f in pipeline_files(files, ctx.num_input_pipelines, i))
        for i in range(ctx.num_input_pipelines)
    )
    if not sum(pipeline_examples):
        raise ValueError(f"the validation files {files} hold no records: nothing to evaluate")
    return EvalPlan(
        steps=math.ceil(max(pipeline_examples) / (per_replica * replicas)),
        num_examples=sum(pipeline_examples),
        per_replica_batch_size=per_replica,
        replicas_per_pipeline=replicas,
        pipeline_examples=pipeline_examples,
    )
