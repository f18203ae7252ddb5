"""A run's results on its Vertex AI Pipelines or Kubeflow Pipelines run page: the Trainer's and the
Evaluator's ``system.Metrics`` outputs and the Trainer's ``system.HTML`` output (the run report).

The compiled spec declares them beside the TFX outputs (``pipeline.spec_patches.add_run_page_outputs``).
TFX's container entry point cannot carry them (it imports every output's type as a TFX artifact class, and
``system.Metrics`` is none), so the two steps' containers run ``python -m components.run_page`` with the
entry point's arguments: it takes the ``system.*`` outputs out of the ExecutorInput, runs TFX's entry point on
the rest in this process, then makes those outputs from what the executor left and adds them to the
ExecutorOutput file, where both backends' launchers read every declared output.

- ``system.Metrics``: values in ``metadata``, numbers (a yes as 1.0) but for the line saying why a model was
  not blessed; the Trainer's and the Evaluator's keys differ, as Vertex AI Experiments merges a run's
  metrics outputs into one row. The Trainer's include where the run's time went (goodput and the largest
  badput parts) when its metrics.json holds a time account.
- ``system.HTML``: the HTML file itself at the artifact's URI, plots inlined, as the UIs show it alone in a
  sandboxed frame.
"""

from __future__ import annotations

import json
import re
import sys

METRICS, HTML = "system.Metrics", "system.HTML"
SCHEMA_VERSION = "0.0.1"
TFX_ENTRY_POINT = "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"
ENTRY_POINT = "components.run_page"
INVOCATION_FLAG = "--json_serialized_invocation_args"
# The outputs each step adds, by the compiled component's name: output name -> type.
OUTPUTS = {
    "Trainer": {"trainer_metrics": METRICS, "run_report": HTML},
    "Evaluator": {"evaluator_metrics": METRICS},
}
DISPLAY_NAMES = {
    "trainer_metrics": "Trainer: the training run",
    "run_report": "Trainer: run report",
    "evaluator_metrics": "Evaluator: the gate",
}
# The badput parts the Trainer's metrics name, the largest first.
BADPUT_PARTS_SHOWN = 3


def artifact_type(type_name: str) -> dict:
    """An output's ``artifactType`` as the KFP SDK compiles its own ``system.*`` outputs."""
    return {"schemaTitle": type_name, "schemaVersion": SCHEMA_VERSION}


def trainer_metrics(model_run_uri: str) -> dict[str, float]:
    """The training run's result (its ``metrics.json``): the in-loop top-1/top-5 on the validation split, the
    target and whether it was reached (and when), epochs and steps trained, images a second; and where the
    run's time went when it holds a time account (``time_account_metrics``)."""
    from trainer_module import files
    from trainer_module.recorder import METRICS_FILE, time_account

    result = files.read_json(files.join(model_run_uri, METRICS_FILE))
    history = result.get("history") or [{}]
    values = {
        "trainer_top1": result.get("final_top1"),
        "trainer_top5": result.get("final_top5"),
        "target_top1": result.get("target_top1"),
        "target_reached": 1.0 if result.get("target_reached") else 0.0,
        "time_to_target_seconds": result.get("time_to_target_seconds"),
        "epochs": history[-1].get("epoch"),
        "steps": result.get("steps"),
        "images_per_second": result.get("images_per_second"),
        "replicas": result.get("replicas"),
    }
    account = time_account(result)
    if account is not None:
        values.update(time_account_metrics(account))
    return {key: float(value) for key, value in values.items() if value is not None}


def time_account_metrics(account) -> dict[str, float]:
    """The figures of ``account`` (an ``effnet_common.goodput.TimeAccount``): the goodput share (0-1) and
    seconds, the wall time, the seconds of the ``BADPUT_PARTS_SHOWN`` largest badput parts
    (``badput_<part>_seconds``, the part's name in lower case with any other character than a letter, digit
    or ``_`` as ``_``) and the disruptions, when there were any. Seconds are to the millisecond, the record's
    precision."""
    values = {
        "goodput": account.goodput,
        "goodput_seconds": round(account.goodput_seconds, 3),
        "wall_seconds": round(account.wall_seconds, 3),
    }
    for part, seconds in list(account.badput().items())[:BADPUT_PARTS_SHOWN]:
        name = re.sub(r"\W+", "_", part.lower())  # a pipeline step's part is named by the step
        values[f"badput_{name}_seconds"] = round(seconds, 3)
    if account.disruptions:
        values["disruptions"] = float(account.disruptions)
    return values


def evaluator_metrics(evaluation_uri: str, blessing_uri: str, target_top1: float | None) -> dict:
    """The Evaluator's gate: TFMA's top-1 and top-5 on the validation split, the target, the blessing (1.0 or
    0.0) and, when not blessed, each condition that failed."""
    from components import evaluation_results

    metrics = evaluation_results.overall_metrics(evaluation_uri)
    blessed = evaluation_results.is_blessed(blessing_uri)
    values: dict = {
        "evaluator_top1": metrics.get(evaluation_results.TOP1),
        "evaluator_top5": metrics.get(evaluation_results.TOP5),
        "gate_top1": target_top1,
        "blessed": 1.0 if blessed else 0.0,
    }
    values = {key: float(value) for key, value in values.items() if value is not None}
    if not blessed:
        reasons = evaluation_results.evaluation_refusals(evaluation_uri)
        values["not_blessed_because"] = "; ".join(reasons) or "the Evaluator did not bless it"
    return values


def write_report(model_run_uri: str, uri: str) -> None:
    """The run report, self-contained, as the file at ``uri``; a run without a report (it failed before
    writing one) gets a page that says so."""
    from trainer_module import files, recorder, report

    if files.exists(files.join(model_run_uri, report.REPORT_FILE)):
        if recorder.read_time_account(model_run_uri, recorder.RUN_ACCOUNT) is not None:
            # Drawn again: the step added its time account and plan after the trainer wrote the report.
            report.add_pipeline_lines(model_run_uri, {})
        page = report.self_contained_report(model_run_uri)
    else:
        page = f"<!doctype html><p>The training run in {model_run_uri} wrote no report.</p>"
    files.write_text(uri, page)


def _uri(outputs: dict, key: str) -> str:
    return outputs[key]["artifacts"][0]["uri"]


def _parameter(executor_input: dict, name: str):
    inputs = executor_input.get("inputs", {})
    if name in inputs.get("parameterValues", {}):
        return inputs["parameterValues"][name]
    value = inputs.get("parameters", {}).get(name, {})
    return value.get("numberValue", value.get("doubleValue"))


def run_page_outputs(executor_input: dict, added: dict) -> dict:
    """The ExecutorOutput entries of the ``added`` outputs (name -> their ExecutorInput entry), made from the
    executor's TFX outputs."""
    outputs = executor_input["outputs"]["artifacts"]
    entries = {}
    for name, entry in added.items():
        artifact = dict(entry["artifacts"][0])
        metadata = {"display_name": DISPLAY_NAMES.get(name, name)}
        if name == "trainer_metrics":
            metadata.update(trainer_metrics(_uri(outputs, "model_run")))
        elif name == "evaluator_metrics":
            target = _parameter(executor_input, "target_top1")
            metadata.update(evaluator_metrics(_uri(outputs, "evaluation"), _uri(outputs, "blessing"), target))
        elif name == "run_report":
            write_report(_uri(outputs, "model_run"), artifact["uri"])
        else:
            raise ValueError(f"output {name!r} is not one this step makes (components.run_page.OUTPUTS)")
        entries[name] = {
            "artifacts": [{"name": artifact.get("name", ""), "uri": artifact["uri"], "metadata": metadata}]
        }
    return entries


def split_outputs(executor_input: dict) -> dict:
    """Takes the ``system.*`` outputs out of ``executor_input`` (in place) and returns them by name."""
    outputs = executor_input.get("outputs", {}).get("artifacts", {})
    added = {}
    for name in list(outputs):
        schema = outputs[name]["artifacts"][0].get("type", {}).get("schemaTitle", "")
        if schema.startswith("system."):
            added[name] = outputs.pop(name)
    return added


def _run_tfx_entry_point(argv: list[str]) -> None:
    """TFX's container entry point on ``argv``, in this process, as its ``__main__`` runs it; returns when it
    succeeded (its failure propagates as it would have ended the container)."""
    from absl import app
    from tfx.orchestration.kubeflow.v2.container import kubeflow_v2_run_executor as entry

    try:
        app.run(entry.main, argv=[TFX_ENTRY_POINT, *argv], flags_parser=entry._parse_flags)  # noqa: SLF001
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise


def main(argv: list[str] | None = None) -> int:
    from trainer_module import files

    argv = list(sys.argv[1:] if argv is None else argv)
    position = argv.index(INVOCATION_FLAG) + 1
    executor_input = json.loads(argv[position])
    added = split_outputs(executor_input)
    argv[position] = json.dumps(executor_input)
    _run_tfx_entry_point(argv)
    if added:
        output_file = executor_input["outputs"]["outputFile"]
        executor_output = json.loads(files.read_text(output_file))
        executor_output.setdefault("artifacts", {}).update(run_page_outputs(executor_input, added))
        files.write_text(output_file, json.dumps(executor_output))
    return 0


if __name__ == "__main__":
    from effnet_common import quick_exit

    quick_exit.exit_with(main())
