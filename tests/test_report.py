"""The run's record and report: training curves at a steady cadence (run log and TensorBoard), the per-step
records of the compiled loop, the run's state (finished, interrupted, running, stopped without a word), and
the plots' choices (zoomed accuracy axis, the losses' floor, rates only with enough points)."""

import dataclasses
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from effnet_common import console, goodput
from trainer_module import presets, report, time_report, train
from trainer_module.__main__ import main
from trainer_module.config import replace
from trainer_module.recorder import Recorder, TrainingCall, read_run_log

BATCH = 64
STEP_SECONDS = 0.1  # each step of the synthetic calls, inside a call
GAP_SECONDS = 5.0  # between two calls: the host's work, which images/s must leave out


def _recorder(directory, cadence: int, steps_per_epoch: float = 22.45) -> Recorder:
    return Recorder(
        log_dir=str(directory),
        model_dir=str(directory),
        checkpoint_dir=str(directory / "checkpoints"),
        tensorboard_dir=str(directory / "tensorboard"),
        chief=True,
        global_batch_size=BATCH,
        steps_per_epoch=steps_per_epoch,
        summary_every_steps=cadence,
    )


def _call(first_step: int, num_steps: int, clock: float, regularisation: float = 0.0) -> TrainingCall:
    """A call's records: step s (1-based) has loss s, cross-entropy s / 10, the learning rate s / 1000."""
    steps = np.arange(first_step + 1, first_step + num_steps + 1, dtype=np.float32)
    return TrainingCall(
        end_step=first_step + num_steps,
        seconds=num_steps * STEP_SECONDS,
        loss=steps + regularisation,
        regularisation=np.full(num_steps, regularisation, np.float32),
        cross_entropy=steps / 10,
        learning_rate=steps / 1000,
        time=clock + STEP_SECONDS * np.arange(1, num_steps + 1),
    )


def _train(recorder: Recorder, calls: list[int], first_step: int = 0, regularisation: float = 0.0) -> int:
    """Feeds calls of the given lengths to ``recorder``, a gap between two; returns the last step."""
    step, clock = first_step, 1000.0
    for num in calls:
        recorder.training(_call(step, num, clock, regularisation), total_steps=1000)
        step += num
        clock += num * STEP_SECONDS + GAP_SECONDS
    return step


def _story(log: list[dict], *kinds: str) -> list[str]:
    """The attempts' events of a run log (starts, interruptions) and those of ``kinds``, in order."""
    return [e["event"] for e in log if e["event"] in ("start", "interrupted", *kinds)]


def _scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard's scalars in a directory of event files: tag -> [(step, value)]."""
    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(tf.io.gfile.glob(f"{directory}/events.out.tfevents.*")):
        for raw in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(raw.numpy())
            for value in event.summary.value:
                number = (
                    float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                )
                found.setdefault(value.tag, []).append((event.step, number))
    return found


# ------------------------------------------------------------------------------------- the training curves


def test_the_tensorboard_command_is_the_environments_own_and_quotes_the_directory(tmp_path):
    logdir = str(tmp_path / "a run" / "tensorboard")
    program, flag, where = shlex.split(console.tensorboard_command(logdir))
    assert program == console.program_command("tensorboard") and (flag, where) == ("--logdir", logdir)


def test_curve_points_fall_every_n_steps_across_calls_as_means_of_their_window(tmp_path):
    recorder = _recorder(tmp_path, cadence=5)
    _train(recorder, [7, 7, 7])
    recorder.evaluation(21, 12.0, {"top1": 0.5, "top5": 0.9, "loss": 1.5, "examples": 100})
    recorder.flush()
    points = [e for e in read_run_log(str(tmp_path / "run_log.jsonl")) if e["event"] == "train"]
    assert [p["step"] for p in points] == [5, 10, 15, 20]
    # Each point is the mean over the steps since the previous point (loss s at step s), whatever the calls.
    assert [p["loss"] for p in points] == pytest.approx([3, 8, 13, 18])
    assert [p["cross_entropy"] for p in points] == pytest.approx([0.3, 0.8, 1.3, 1.8])
    assert [p["learning_rate"] for p in points] == pytest.approx([0.005, 0.010, 0.015, 0.020])
    assert all(p["steps"] == 5 for p in points)
    assert [p["epoch"] for p in points] == pytest.approx([s / 22.45 for s in (5, 10, 15, 20)])
    # Images/s from the steps' own durations: the 5 s the host spends between two calls is not in it.
    assert [p["images_per_second"] for p in points] == pytest.approx([BATCH / STEP_SECONDS] * 4)

    scalars = _scalars(tmp_path / "tensorboard")
    for tag in ("train/loss", "train/cross_entropy", "train/learning_rate", "train/images_per_second"):
        assert [step for step, _ in scalars[tag]] == [5, 10, 15, 20], tag
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([3, 8, 13, 18])
    assert "train/regularisation" not in scalars  # a loss without an L2 term draws no flat zero
    assert scalars["eval/top1"] == [(21, pytest.approx(0.5))]


@pytest.mark.parametrize("every", [0, -10])
def test_the_cadence_is_at_least_one_step(every):
    with pytest.raises(ValueError, match=f"loop.summary_every_steps={every} must be at least 1"):
        replace(presets.get_preset("demo"), {"loop.summary_every_steps": every})


def test_a_window_without_a_timed_step_has_no_rate_and_the_l2_term_is_written(tmp_path):
    # One-step calls: no step follows another in its call, so none is timed; the points keep every other value.
    recorder = _recorder(tmp_path, cadence=2)
    _train(recorder, [1, 1, 1, 1], regularisation=0.25)
    recorder.flush()
    points = [e for e in read_run_log(str(tmp_path / "run_log.jsonl")) if e["event"] == "train"]
    assert [(p["step"], p["images_per_second"]) for p in points] == [(2, None), (4, None)]
    scalars = _scalars(tmp_path / "tensorboard")
    assert "train/images_per_second" not in scalars
    assert scalars["train/regularisation"] == [(2, pytest.approx(0.25)), (4, pytest.approx(0.25))]


def test_the_first_calls_rate_leaves_its_tracing_out(tmp_path):
    recorder = _recorder(tmp_path, cadence=5)
    traced = dataclasses.replace(_call(0, 10, 1000.0), seconds=30.0)  # 29 s of tracing and compilation
    recorder.training(traced, total_steps=1005)
    recorder.training(_call(10, 10, 1040.0), total_steps=1000)
    recorder.flush()
    progress = [e for e in read_run_log(str(tmp_path / "run_log.jsonl")) if e["event"] == "progress"]
    assert [p["images_per_second"] for p in progress] == pytest.approx([BATCH / STEP_SECONDS] * 2)
    assert progress[0]["eta"] == "1m39s"  # 995 steps of 0.1 s, not of 3 s
    result = recorder.finish(None, replicas=1, eval_examples=0, allreduce=None)
    assert result.first_call_seconds == 30.0


def test_resume_drops_the_records_of_steps_trained_again_and_keeps_the_attempts(tmp_path):
    first = _recorder(tmp_path, cadence=5)
    first.event("start", step=0, total_steps=100)
    _train(first, [10])
    first.evaluation(10, 5.0, {"top1": 0.5, "top5": 0.9, "loss": 1.5, "examples": 100})
    first.flush()
    _train(first, [10], first_step=10)  # trained after the checkpoint of step 10, then Ctrl-C
    first.event(
        "profile", directory="trace", first_step=12, end_step=14
    )  # its trace stays: so does its record
    first.interrupted(KeyboardInterrupt())

    log = read_run_log(str(tmp_path / "run_log.jsonl"))
    assert log[-1]["event"] == "interrupted" and log[-1]["step"] == 20
    assert log[-1]["reason"] == "stopped by the user (Ctrl-C)"
    assert log[0]["host"] == socket.gethostname() and log[0]["pid"] == os.getpid()

    second = _recorder(tmp_path, cadence=5)
    second.resume(10)
    second.event("start", step=10, total_steps=100, resumed=True)
    _train(second, [10], first_step=10)
    second.flush()
    log = read_run_log(str(tmp_path / "run_log.jsonl"))
    assert _story(log, "eval", "profile") == ["start", "eval", "profile", "interrupted", "start"]
    assert [e["step"] for e in log if e["event"] == "train"] == [5, 10, 15, 20]  # none twice
    assert [e["step"] for e in log if e["event"] == "progress"] == [10, 20]


def test_an_error_is_recorded_with_its_first_line(tmp_path):
    class Broken(RuntimeError):
        pass

    _recorder(tmp_path, cadence=5).interrupted(Broken("the disk is full\nand more"))
    assert read_run_log(str(tmp_path / "run_log.jsonl"))[-1]["reason"] == "Broken: the disk is full"


def test_a_non_finite_loss_is_found_at_its_step():
    call = _call(40, 5, 0.0)
    assert call.first_non_finite() is None
    call.loss[2] = np.nan
    assert call.first_non_finite()[0] == 43 and math.isnan(call.first_non_finite()[1])


# --------------------------------------------------------------------------------------------- the state


def _record(events: list[dict], metrics: dict | None = None, **loop) -> report.RunRecord:
    config = replace(presets.get_preset("demo"), {f"loop.{k}": v for k, v in loop.items()})
    return report.RunRecord("runs/x", json.loads(config.to_json()), config.plan.to_dict(), events, metrics)


def _events(host: str, pid: int, started: float, evaluations: list[float], last: dict | None = None) -> list:
    events = [{"event": "start", "time": started, "step": 0, "host": host, "pid": pid}]
    for index, at in enumerate(evaluations, start=1):
        events.append({"event": "eval", "time": at, "step": 100 * index, "top1": 0.5})
    return events + ([last] if last else [])


def test_state_of_a_finished_and_of_a_truncated_run():
    finished = _record(_events("h", 1, 0.0, [10.0], {"event": "end", "time": 11.0}), {"target_reached": True})
    assert report.run_state(finished).label == "finished"
    truncated = _record(
        _events("h", 1, 0.0, [10.0], {"event": "end", "time": 11.0}), {"stopped_at_epoch": 10}
    )
    state = report.run_state(truncated)
    assert state.label == "stopped early" and "epoch 10 of 30" in state.summary


def test_state_of_an_interrupted_run_names_the_reason_and_the_checkpoint_it_resumes_from():
    last = {"event": "interrupted", "time": 30.0, "step": 140, "reason": "stopped by the user (Ctrl-C)"}
    state = report.run_state(_record(_events("h", 1, 0.0, [10.0], last)))
    assert state.label == "interrupted"
    assert state.summary == (
        "interrupted at step 140: stopped by the user (Ctrl-C); its last checkpoint is step 100: "
        "running the same command again resumes from it"
    )
    early = report.run_state(_record(_events("h", 1, 0.0, [], {**last, "step": 20})))
    assert "no checkpoint was written yet" in early.summary


def test_state_on_this_host_follows_the_writing_process():
    host, now = socket.gethostname(), time.time()
    running = report.run_state(_record(_events(host, os.getpid(), now - 5, [])))
    assert running.label == "running" and f"process {os.getpid()} on this host runs" == running.evidence
    ended = subprocess.Popen(["true"])
    ended.wait()
    stopped = report.run_state(_record(_events(host, ended.pid, now - 5, [now - 2])))
    assert (
        stopped.label == "stopped"
        and "stopped without a word, its log ending at step 100 of 674" in stopped.summary
    )
    assert "its last checkpoint is step 100" in stopped.summary
    # A live process that started after the log's start is another one that reuses the number.
    reused = report.run_state(_record(_events(host, os.getpid(), now - 10 * 24 * 3600, [])))
    assert reused.label == "stopped"


def test_state_from_another_host_follows_the_silence_against_the_gaps_between_writes():
    events = _events("elsewhere", 7, 0.0, [60.0, 120.0])
    assert report.run_state(_record(events), now=200.0).label == "running"  # 80 s <= 2 x 60 s
    stopped = report.run_state(_record(events), now=300.0)
    assert stopped.label == "stopped" and "nothing written for 3m00s" in stopped.summary
    assert "elsewhere" in stopped.evidence
    unknown = report.run_state(_record(_events("elsewhere", 7, 0.0, [])), now=5000.0)
    assert unknown.label == "unknown" and "no evaluation yet" in unknown.summary
    old_log = [{k: v for k, v in e.items() if k not in ("host", "pid")} for e in events]  # before host/pid
    assert report.run_state(_record(old_log), now=200.0).label == "running"


# --------------------------------------------------------------------------------------------- the plots


def test_the_accuracy_axis_zooms_with_the_target_and_a_top5_of_one_inside_the_frame():
    low, high = report.accuracy_limits([0.875, 0.9415, 0.961, 0.99, 1.0, 0.95])
    assert low < 0.875 and high > 1.0  # nothing on the frame's edge
    assert high - low < 0.2  # a 0-1 axis would squash the crossing of 0.95


def test_the_floor_is_the_smoothed_cross_entropy_of_a_perfect_prediction():
    assert report.smoothed_floor(0.1, 1000) == pytest.approx(1.0148, abs=1e-4)
    assert report.smoothed_floor(0.0, 1000) == 0.0
    # Keras' label-smoothed cross-entropy of logits that predict the smoothed target exactly: the floor.
    smoothing, classes = 0.1, 1000
    target = np.full((1, classes), smoothing / classes, np.float32)
    target[0, 3] += 1 - smoothing
    loss = keras.losses.categorical_crossentropy(
        tf.one_hot([3], classes), np.log(target), from_logits=True, label_smoothing=smoothing
    )
    assert float(loss[0]) == pytest.approx(report.smoothed_floor(smoothing, classes), rel=1e-5)
    labels = report.LossLabels.of(_record([]).config, _record([]).plan)
    assert "label smoothing 0.1 over 1000 classes" in labels.objective and "LARS" in labels.objective
    rmsprop = replace(presets.get_preset("demo"), {"optimizer.name": "rmsprop"})
    l2 = report.LossLabels.of(json.loads(rmsprop.to_json()), rmsprop.plan.to_dict())
    assert "+ 1e-05 x sum of w²/2 over the kernels" in l2.objective


def test_the_loss_plot_of_a_run_that_trained_no_step_draws_without_a_log_axis_on_nothing():
    """A run resumed at its end (a new target on a finished schedule) evaluates once and trains no step: its
    objective panel has no value, where a log axis has nothing to scale (matplotlib raised)."""
    events = [{"event": "start", "time": 0.0, "step": 674, "host": "h", "pid": 1}]
    events.append(
        {"event": "eval", "time": 1.0, "step": 674, "epoch": 30.0, "top1": 0.96, "top5": 1.0, "loss": 0.2}
    )
    assert report.loss_plot(_record(events)).startswith(b"\x89PNG")
    assert report.loss_plot(_record(events[:1])).startswith(b"\x89PNG")


def _model_dir(directory, calls: list[int]) -> str:
    """A model directory written by the Recorder as a run writes it: config, the calls, two evaluations."""
    config = presets.get_preset("demo")
    recorder = _recorder(directory, cadence=config.loop.summary_every_steps, steps_per_epoch=22.45)
    recorder.write_config(config.to_json(), config.plan.to_dict())
    recorder.event("start", step=0, total_steps=config.plan.total_steps)
    step = _train(recorder, calls)
    recorder.evaluation(step // 2, 20.0, {"top1": 0.8747, "top5": 0.9916, "loss": 0.70, "examples": 359})
    recorder.evaluation(step, 40.0, {"top1": 0.9610, "top5": 1.0, "loss": 0.22, "examples": 359})
    recorder.finish(0.95, replicas=1, eval_examples=359, allreduce=None)
    return str(directory)


def _linked_images(page: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', page)


def test_the_report_draws_every_plot_of_a_run_with_a_curve(tmp_path):
    model_dir = _model_dir(tmp_path, [200, 200])
    page = open(report.write_report(model_dir)).read()
    assert _linked_images(page) == list(report.PLOTS.values())
    for name in _linked_images(page):
        assert tf.io.decode_png(open(os.path.join(model_dir, name), "rb").read()).shape[1] > 700, name
    assert "finished at step 400 of 674" in page and "the run log ends with the run&#x27;s end" in page
    assert (
        "images/s, the steps alone (median of the curve&#x27;s points)</th><td>640.0 over 40 points" in page
    )
    assert "label smoothing keeps it above its floor" in page


def test_the_pipelines_lines_are_added_to_the_page_without_drawing_again(tmp_path, monkeypatch):
    model_dir = _model_dir(tmp_path, [20, 20])  # too few rate points: that plot is said in words
    drawn_page = open(report.write_report(model_dir)).read()

    def no_drawing(*args):
        raise AssertionError("drawn again")

    for plot in ("accuracy_plot", "schedule_plot", "throughput_plot", "loss_plot"):
        monkeypatch.setattr(report, plot, no_drawing)
    page = open(report.add_pipeline_lines(model_dir, {"TFMA top-1": "0.9694 (blessed)"})).read()
    assert "TFMA top-1" in page and "0.9694 (blessed)" in page and "TFMA top-1" not in drawn_page
    assert (
        _linked_images(page)
        == _linked_images(drawn_page)
        == [name for key, name in report.PLOTS.items() if key != "throughput"]
    )
    assert "images/s: 4 points of the curve, too few to draw" in page
    os.remove(os.path.join(model_dir, report.PLOTS["loss"]))  # a plot that is always drawn is gone: all again
    with pytest.raises(AssertionError, match="drawn again"):
        report.add_pipeline_lines(model_dir, {"TFMA top-1": "0.9694"})
    os.remove(os.path.join(model_dir, report.REPORT_FILE))  # no page yet: the whole one is drawn
    with pytest.raises(AssertionError, match="drawn again"):
        report.add_pipeline_lines(model_dir, {"TFMA top-1": "0.9694"})


def test_too_few_rate_points_are_said_in_words_not_drawn(tmp_path):
    model_dir = _model_dir(tmp_path, [20, 20])  # 4 points, every 10 steps
    page = open(report.write_report(model_dir)).read()
    assert report.PLOTS["throughput"] not in _linked_images(page)
    assert not os.path.exists(os.path.join(model_dir, report.PLOTS["throughput"]))
    assert "images/s: 4 points of the curve, too few to draw (it takes 5" in page


def test_a_log_without_curve_points_takes_the_rates_of_calls_after_each_attempts_first(tmp_path):
    events = [{"event": "start", "time": 0.0, "step": 0}]
    for index in range(4):
        events.append(
            {"event": "progress", "time": 1.0, "step": 10 * (index + 1), "images_per_second": index}
        )
    events.append({"event": "start", "time": 2.0, "step": 40, "resumed": True})
    for index in range(4, 8):
        events.append(
            {"event": "progress", "time": 3.0, "step": 10 * (index + 1), "images_per_second": index}
        )
    assert report.rate_points(_record(events)) == [(20, 1), (30, 2), (40, 3), (60, 5), (70, 6), (80, 7)]


# ------------------------------------------------------------------------------------- the compiled loop


@pytest.mark.slow  # builds and traces the smoke run's network
def test_the_compiled_loop_returns_each_steps_records():
    config = replace(
        presets.get_preset("smoke"),
        {
            "optimizer.name": "rmsprop",  # the L2 term in the loss
            "optimizer.label_smoothing": 0.0,  # then the loss is the plain cross-entropy plus the L2 term
            "model.num_classes": 10,
            "data.num_train_examples": 64,
        },
    )
    trainer = train.Trainer(config, tf.distribute.OneDeviceStrategy("/cpu:0"))
    rng = np.random.default_rng(0)
    batch = (
        tf.constant(rng.uniform(0, 255, (8, 32, 32, 3)), tf.float32),
        tf.constant(np.arange(8) % 10, tf.int32),
    )
    kernels = train.l2_variables(trainer.model)
    l2_before = config.plan.l2_loss_weight * sum(float(tf.nn.l2_loss(v)) for v in kernels)
    records = {
        key: value.numpy()
        for key, value in trainer.train_loop(
            iter(tf.data.Dataset.from_tensors(batch).repeat()), tf.constant(6)
        ).items()
    }
    assert sorted(records) == sorted(train.STEP_RECORDS)
    assert all(len(values) == 6 for values in records.values())
    assert records["regularisation"][0] == pytest.approx(l2_before, rel=1e-5)  # the first step's weights
    np.testing.assert_allclose(
        records["loss"], records["cross_entropy"] + records["regularisation"], rtol=1e-5
    )
    schedule = trainer.optimizer._learning_rate
    np.testing.assert_allclose(records["learning_rate"], [float(schedule(s)) for s in range(1, 7)], rtol=1e-6)
    assert np.all(np.diff(records["time"]) > 0)
    assert trainer.step == 6


def _cli(model_dir, shards, *sets):
    args = [sys.executable, "-m", "trainer_module", "--preset", "smoke", "--model-dir", str(model_dir)]
    args += ["--train-files", shards["train"], "--eval-files", shards["eval"]]
    for s in sets:
        args += ["--set", s]
    return args


@pytest.mark.slow
def test_ctrl_c_is_written_to_the_run_log_and_the_report_says_so(digit_shards, tmp_path):
    sets = (
        "data.num_train_examples=400",
        "data.global_batch_size=16",
        "loop.train_epochs=3",
        "loop.eval_every_epochs=1",
        "loop.steps_per_loop=5",
        "loop.summary_every_steps=5",
        "loop.deterministic=true",  # the loop's clock is then Python's: TensorFlow refuses its timestamp op
    )
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp_path / "tmp")}
    model_dir = tmp_path / "run"
    proc = subprocess.Popen(
        _cli(model_dir, digit_shards, *sets),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # Python ignores SIGINT for good in a process started with it ignored (a shell's background job).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 300
    while (
        time.time() < deadline
        and proc.poll() is None
        and not tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    ):
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)

    log = read_run_log(str(model_dir / "run_log.jsonl"))
    assert log[-1]["event"] == "interrupted" and log[-1]["reason"] == "stopped by the user (Ctrl-C)"
    assert main(["report", str(model_dir)]) == 0
    page = (model_dir / "report.html").read_text()
    assert f"interrupted at step {log[-1]['step']}: stopped by the user (Ctrl-C)" in page
    checkpoint = [e["step"] for e in log if e["event"] == "eval"][-1]
    assert f"its last checkpoint is step {checkpoint}: running the same command again resumes from it" in page
    # The log holds every training-curve point up to the last trained step, each once.
    points = [e for e in log if e["event"] == "train"]
    assert [p["step"] for p in points] == list(range(5, log[-1]["step"] + 1, 5))
    assert all(p["images_per_second"] > 0 for p in points)  # every 5-step window holds timed steps


def test_the_plan_rows_put_the_plans_time_and_cost_beside_the_measured_ones():
    account = goodput.TimeAccount.of(
        [goodput.Span(0, 3000, goodput.GOODPUT), goodput.Span(3000, 5400, "PROVISIONING")], 0, 5400
    )
    planned = {"hours": 1.02, "accelerator_hours": 1044.5, "unit": "TPU v3 cores", "usd_per_unit_hour": 1.0}
    rows = dict(time_report.plan_rows({**planned, "prices": "a list price"}, account, held_hours=1.3))
    assert rows["time: plan / measured"] == (
        "1h01m of training at the nominal rate / 1h30m of wall time, 50m00s of it goodput"
    )
    # The units per hour of the plan (1,024 cores) over the hours held: 1,331 core-hours.
    assert rows["accelerators: plan / measured"] == (
        "1,044 / 1,331 hours of TPU v3 cores; cost at $1.00 an hour each (a list price): $1,044.50 / $1,331.23"
    )
    assert rows["the largest difference from the plan"].startswith("provisioning, 40m00s")
