"""The run page's outputs (components.run_page) made from a step's files, without the step: the system.* outputs
taken out of the ExecutorInput, the training run's metrics, the report made self-contained. The steps
themselves, as their containers run them, are tests/test_vertex_steps.py's."""

import base64
import json

from components import run_page


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
