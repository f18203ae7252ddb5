"""What a pipeline run ended with, read back from its ML Metadata store: top-1, blessing, push destination."""

from __future__ import annotations

import dataclasses

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from components import evaluation_results


@dataclasses.dataclass(frozen=True)
class Outcome:
    target_top1: float
    top1: float | None
    top5: float | None
    blessed: bool
    pushed: bool
    pushed_destination: str | None
    model_uri: str | None
    model_run_uri: str | None = None  # the Trainer's model directory: metrics.json, report.html, TensorBoard
    tuned: dict = dataclasses.field(
        default_factory=dict
    )  # settings a Tuner step chose (config.json's "tuned")
    refusals: tuple[str, ...] = ()  # why the Evaluator did not bless: each condition that failed

    def report(self, pushed_before: bool = False) -> str:
        """The verdict's lines; ``pushed_before``: the push is an earlier run's (the Pusher was cached)."""
        top1 = "unknown" if self.top1 is None else f"{self.top1:.4f}"
        lines = []
        if self.tuned:
            values = " ".join(
                f"{key.rpartition('.')[2]}={value:.4g}" for key, value in sorted(self.tuned.items())
            )
            lines.append(f"trained with the Tuner's values: {values}")
        lines.append(f"top-1 on the validation split: {top1} (target {self.target_top1:.4f})")
        if self.blessed:
            lines.append("model BLESSED by the Evaluator")
        else:
            lines.append(f"model NOT blessed: {'; '.join(self.refusals) or 'the Evaluator did not bless it'}")
        if self.pushed and pushed_before:
            lines.append(
                f"already pushed to {self.pushed_destination} (the same model; nothing pushed again)"
            )
        elif self.pushed:
            lines.append(f"pushed to {self.pushed_destination}")
        else:
            lines.append("nothing pushed")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def report_lines(self) -> dict[str, object]:
        """The pipeline's verdict for the run report's summary."""
        return {
            "TFMA top-1 (validation split)": None if self.top1 is None else f"{self.top1:.4f}",
            "TFMA top-5 (validation split)": None if self.top5 is None else f"{self.top5:.4f}",
            "blessed by the Evaluator": self.blessed,
            "pushed to": self.pushed_destination if self.pushed else "nothing pushed",
        }


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _store(metadata_path: str) -> metadata_store.MetadataStore:
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(config)


def _latest(store, artifacts, type_name: str):
    type_id = store.get_artifact_type(type_name).id
    matching = [a for a in artifacts if a.type_id == type_id]
    return max(matching, key=lambda a: a.id) if matching else None


def _int_property(artifact, name: str) -> int | None:
    if artifact is None or name not in artifact.custom_properties:
        return None
    return artifact.custom_properties[name].int_value


def read_outcome(metadata_path: str, pipeline_name: str, target_top1: float) -> Outcome:
    """The latest Evaluator and Pusher outputs of ``pipeline_name`` in the SQLite store at
    ``metadata_path``."""
    store = _store(metadata_path)
    context = store.get_context_by_type_and_name("pipeline", pipeline_name)
    if context is None:
        raise RuntimeError(f"{metadata_path} holds no pipeline named {pipeline_name!r}")
    artifacts = store.get_artifacts_by_context(context.id)
    evaluation = _latest(store, artifacts, "ModelEvaluation")
    blessing = _latest(store, artifacts, "ModelBlessing")
    pushed = _latest(store, artifacts, "PushedModel")
    model = _latest(store, artifacts, "Model")
    model_run = _latest(store, artifacts, "ModelRun")
    metrics = evaluation_results.overall_metrics(evaluation.uri) if evaluation else {}
    destination = None
    if pushed is not None and "pushed_destination" in pushed.custom_properties:
        destination = pushed.custom_properties["pushed_destination"].string_value
    return Outcome(
        target_top1=target_top1,
        top1=metrics.get(evaluation_results.TOP1),
        top5=metrics.get(evaluation_results.TOP5),
        blessed=_int_property(blessing, "blessed") == 1,
        pushed=_int_property(pushed, "pushed") == 1,
        pushed_destination=destination,
        model_uri=model.uri if model else None,
        model_run_uri=model_run.uri if model_run else None,
        tuned=_tuned(model_run.uri) if model_run else {},
        refusals=(
            evaluation_results.evaluation_refusals(evaluation.uri)
            if evaluation and _int_property(blessing, "blessed") != 1
            else ()
        ),
    )


def _tuned(model_run_uri: str) -> dict:
    """The settings a Tuner chose for the run in ``model_run_uri`` (its config.json), or {}."""
    from trainer_module import files

    path = files.join(model_run_uri, "config.json")
    return dict(files.read_json(path).get("tuned") or {}) if files.exists(path) else {}
