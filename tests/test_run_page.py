"""The run page's outputs (components.run_page) made from a step's files, without the step: the system.* outputs
taken out of the ExecutorInput, the training run's metrics (with its time account when it has one), the report
made self-contained. The steps themselves, as their containers run them, are tests/test_vertex_steps.py's."""

import base64
import json

from components import run_page
from effnet_common.goodput import Span, TimeAccount
from trainer_module.recorder import RUN_ACCOUNT, TRAINING_ACCOUNT


def _executor_input(tmp_path) -> dict:
    def output(key, title):
        artifact = {"name": f"Trainer-{key}", "uri": str(tmp_path / "root" / key), "metadata": {}}
        return {
            "artifacts": [{**artifact, "type": {"schemaTitle": title} if title else {"instanceSchema": "x"}}]
        }

    return {
        "inputs": {"parameterValues": {"target_top1": 0.5}},
        "outputs": {
            "artifacts": {
                "model": output("model", ""),
                "model_run": output("model_run", ""),
                "trainer_metrics": output("trainer_metrics", run_page.METRICS),
                "run_report": output("run_report", run_page.HTML),
            },
            "outputFile": str(tmp_path / "executor_output.json"),
        },
    }


def test_the_system_outputs_are_taken_out_for_tfx_and_made_from_the_training_runs_files(tmp_path):
    executor_input = _executor_input(tmp_path)
    added = run_page.split_outputs(executor_input)
    assert sorted(added) == ["run_report", "trainer_metrics"]
    assert sorted(executor_input["outputs"]["artifacts"]) == ["model", "model_run"]  # what TFX is given

    model_run = tmp_path / "root" / "model_run"
    model_run.mkdir(parents=True)
    history = [{"step": 50, "epoch": 1.0, "top1": 0.4}, {"step": 100, "epoch": 2.0, "top1": 0.61}]
    result = {"final_top1": 0.61, "final_top5": 0.9, "target_top1": 0.5, "target_reached": True,
              "time_to_target_seconds": 12.5, "steps": 100, "images_per_second": 800.0, "replicas": 2,
              "history": history}  # fmt: skip
    (model_run / "metrics.json").write_text(json.dumps(result))
    png = b"\x89PNG\r\n\x1a\n a plot"
    (model_run / "report_top1.png").write_bytes(png)
    (model_run / "report.html").write_text('<!doctype html><img src="report_top1.png" alt="accuracy">')

    entries = run_page.run_page_outputs(executor_input, added)
    (metrics,) = entries["trainer_metrics"]["artifacts"]
    assert metrics["uri"] == str(tmp_path / "root" / "trainer_metrics")
    assert metrics["metadata"] == {
        "display_name": "Trainer: the training run", "trainer_top1": 0.61, "trainer_top5": 0.9,
        "target_top1": 0.5, "target_reached": 1.0, "time_to_target_seconds": 12.5, "epochs": 2.0,
        "steps": 100.0, "images_per_second": 800.0, "replicas": 2.0,
    }  # fmt: skip
    page = (tmp_path / "root" / "run_report").read_text()  # the file itself, at the output's URI
    inlined = base64.b64encode(png).decode()
    assert page == f'<!doctype html><img src="data:image/png;base64,{inlined}" alt="accuracy">'


def test_a_run_that_wrote_no_report_gets_a_page_saying_so(tmp_path):
    model_run = tmp_path / "model_run"
    model_run.mkdir()
    run_page.write_report(str(model_run), str(tmp_path / "report"))
    assert "wrote no report" in (tmp_path / "report").read_text()


def _training_result(**extra) -> dict:
    history = [{"step": 100, "epoch": 2.0, "top1": 0.61}]
    return {"final_top1": 0.61, "final_top5": 0.9, "target_top1": 0.5, "target_reached": False, "steps": 100,
            "history": history, **extra}  # fmt: skip


TRAINING_METRICS = {
    "trainer_top1": 0.61, "trainer_top5": 0.9, "target_top1": 0.5, "target_reached": 0.0, "epochs": 2.0,
    "steps": 100.0,
}  # fmt: skip


def test_the_trainers_metrics_add_where_the_runs_time_went_when_metrics_json_holds_an_account(tmp_path):
    """The run's account (the one the pipeline's runner adds) over the training's: goodput, the wall time,
    the three largest badput parts and the disruptions."""
    spans = [
        Span(1000.0, 1100.0, "TRAINER_STEP"),  # the least specific: what the others leave, 21 s
        Span(1000.0, 1010.0, "COMMAND_STARTUP"),
        Span(1010.0, 1016.0, "TPU_INITIALIZATION"),
        Span(1016.0, 1057.0, "GOODPUT"),
        Span(1057.0, 1060.0, "WASTED_PROGRESS_FROM_DISRUPTION"),
        Span(1060.0, 1067.0, "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"),
        Span(1080.0, 1092.0, "EXPORT"),
    ]
    run = TimeAccount.of(spans, 1000.0, 1100.0, disrupted=[(1067.0, 3)])  # restarted at 1067 s, 3 steps again
    training = TimeAccount.of([Span(1016.0, 1057.0, "GOODPUT")], 1010.0, 1092.0)
    result = _training_result(**{RUN_ACCOUNT: run.to_dict(), TRAINING_ACCOUNT: training.to_dict()})
    (tmp_path / "metrics.json").write_text(json.dumps(result))
    assert run_page.trainer_metrics(str(tmp_path)) == {
        **TRAINING_METRICS, "goodput": 0.41, "goodput_seconds": 41.0, "wall_seconds": 100.0,
        "badput_trainer_step_seconds": 21.0, "badput_export_seconds": 12.0,
        "badput_command_startup_seconds": 10.0, "disruptions": 1.0,
    }  # fmt: skip

    # A training's own account, without disruptions (and a pipeline step's part, named by the step).
    training = TimeAccount.of([Span(0.0, 5.0, "GOODPUT"), Span(5.0, 7.5, "ImportExampleGen.train")], 0.0, 8.0)
    (tmp_path / "metrics.json").write_text(
        json.dumps(_training_result(**{TRAINING_ACCOUNT: training.to_dict()}))
    )
    assert run_page.trainer_metrics(str(tmp_path)) == {
        **TRAINING_METRICS, "goodput": 0.625, "goodput_seconds": 5.0, "wall_seconds": 8.0,
        "badput_importexamplegen_train_seconds": 2.5, "badput_unaccounted_seconds": 0.5,
    }  # fmt: skip


def test_the_trainers_metrics_without_a_time_account_have_no_goodput(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps(_training_result()))
    assert run_page.trainer_metrics(str(tmp_path)) == TRAINING_METRICS
