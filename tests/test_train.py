"""The training system: in-loop distributed evaluation, strategies, resume after SIGKILL, multi-worker, export."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest
import tensorflow as tf
from loopback import free_ports

from effnet_common import goodput
from trainer_module import goodput_log, presets, train
from trainer_module.config import with_overrides
from trainer_module.data import input_pipeline, release
from trainer_module.recorder import read_run_log

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**overrides):
    base = {"data.num_train_examples": 400, "loop.train_epochs": 2, "loop.eval_every_epochs": 1}
    base.update(overrides)
    return with_overrides(presets.get_preset("smoke"), [f"{k}={v}" for k, v in base.items()])


@pytest.mark.slow
def test_mirrored_replicas_in_bn_groups_count_every_eval_example(digit_shards, logical_cpus, tmp_path):
    # 4 replicas in 2 batch-norm groups: tracing grows with the replica count (8 took 5 minutes of the suite;
    # test_batchnorm checks 8 replicas' group statistics against NumPy). 100 examples pad the last batch of 32.
    config = _config(
        **{
            "loop.strategy": "mirrored",
            "data.num_cores": 4,
            "data.global_batch_size": 32,
            "model.bn_group_size": 2,
        }
    )
    strategy = tf.distribute.MirroredStrategy(devices=logical_cpus[:4])
    paths = train.RunPaths(str(tmp_path))
    metrics, trainer = train.train_and_evaluate(
        config, [digit_shards["train"]], [digit_shards["eval"]], paths, strategy
    )
    assert metrics.replicas == 4
    assert metrics.eval_examples == digit_shards["num_eval"] == 100
    assert [h["examples"] for h in metrics.history] == [100, 100]
    assert [h["step"] for h in metrics.history] == [12, 25]  # epochs of 400 / 32 = 12.5 steps
    for h in metrics.history:
        assert all(np.isfinite(h[k]) for k in ("top1", "top5", "loss"))
        assert 0.0 <= h["top1"] <= h["top5"] <= 1.0
    assert trainer.step == 25
    assert 0.0 < metrics.allreduce_share < 1.0  # gradient all-reduce measured against the step time
    log = read_run_log(str(tmp_path / "run_log.jsonl"))
    assert [e["event"] for e in log if e["event"] in ("start", "eval", "end")] == [
        "start",
        "eval",
        "eval",
        "end",
    ]
    assert os.path.exists(tmp_path / "metrics.json")


def _cli(model_dir, shards, *sets, export=True):
    args = [sys.executable, "-m", "trainer_module", "--preset", "smoke", "--model-dir", str(model_dir)]
    args += ["--train-files", shards["train"], "--eval-files", shards["eval"]]
    args += [] if export else ["--no-export"]
    for s in sets:
        args += ["--set", s]
    return args


RESUME_SETS = (
    # The decay ends near zero, so the final evaluations compare settled models, not two points of a moving one.
    "schedule.end_lr=0.0001",
    "data.num_train_examples=400",
    "data.global_batch_size=16",
    "loop.train_epochs=4",
    "loop.eval_every_epochs=1",
    "loop.steps_per_loop=5",
    "loop.deterministic=true",
)


@pytest.mark.slow
def test_sigkill_and_resume_finishes_bit_for_bit_like_an_uninterrupted_run(digit_shards, tmp_path):
    # A killed process removes none of its temporary files (TensorFlow's generated autograph sources): the
    # runs keep theirs in a directory of the test's. What is compared is the training state, so no run exports.
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp_path / "tmp")}
    straight = tmp_path / "straight"
    started = time.time()
    subprocess.run(
        _cli(straight, digit_shards, *RESUME_SETS, export=False),
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    took = time.time() - started
    with open(straight / "metrics.json") as f:
        expected = json.load(f)
    # The command's time account: its parts add up to the wall time measured here, within 5%.
    account = goodput.TimeAccount.from_dict(expected["training_time_account"])
    assert account.wall_seconds == pytest.approx(took, rel=0.05) and account.disruptions == 0
    assert sum(account.parts.values()) == pytest.approx(account.wall_seconds)
    for part in (
        "COMMAND_STARTUP",
        "TRAINING_PREP",
        "PROGRAM_STARTUP",
        goodput.GOODPUT,
        "EVAL",
        "CHECKPOINT_SAVE",
    ):
        assert account.parts[part] > 0, (part, account.parts)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _cli(killed, digit_shards, *RESUME_SETS, export=False),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300

    # The history is written just before each checkpoint; kill once the checkpoint of step 50 is the one a
    # restart restores: the checkpoint's state file names it only after its index is written.
    def latest_step() -> int:
        latest = tf.train.latest_checkpoint(str(killed / "checkpoints"))
        return int(latest.rpartition("-")[2]) if latest else 0

    while time.time() < deadline and proc.poll() is None:
        if latest_step() >= 50:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "metrics.json").exists()

    subprocess.run(
        _cli(killed, digit_shards, *RESUME_SETS, export=False),
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    with open(killed / "metrics.json") as f:
        resumed = json.load(f)
    # The kill is a disruption of the training's account: the steps trained past step 50 were trained again,
    # and the time from the killed attempt's last recorded step to the next start is the recovery.
    account = goodput.TimeAccount.from_dict(resumed["training_time_account"])
    attempts = goodput_log.read_attempts(str(killed / "checkpoints"))
    assert len(attempts) == 2 and attempts[0].end is None and attempts[1].end is not None
    last_step = attempts[0].steps[-1][0]
    assert account.disruptions == 1 and account.redone_steps == last_step - attempts[1].steps[0][0]
    assert account.parts["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] > 0
    log = read_run_log(str(killed / "run_log.jsonl"))
    starts = [e for e in log if e["event"] == "start"]
    assert [s["resumed"] for s in starts] == [False, True] and starts[1]["step"] >= 50
    assert (
        [h["step"] for h in resumed["history"]]
        == [h["step"] for h in expected["history"]]
        == [25, 50, 75, 100]
    )

    # Same data position, learning rate, optimizer state, weight averages and dropout streams after the
    # restart, and TensorFlow's deterministic kernels: the resumed run is the uninterrupted one, bit for bit.
    def progress(path, after):
        return [e for e in read_run_log(str(path)) if e["event"] == "progress" and e["step"] > after]

    resumed_steps = progress(killed / "run_log.jsonl", starts[1]["step"])
    straight_steps = progress(straight / "run_log.jsonl", starts[1]["step"])
    assert resumed_steps and [e["step"] for e in resumed_steps] == [e["step"] for e in straight_steps]
    for got, want in zip(resumed_steps, straight_steps, strict=True):
        assert (got["learning_rate"], got["loss"]) == (want["learning_rate"], want["loss"])
    for got, want in zip(resumed["history"], expected["history"], strict=True):
        assert (got["top1"], got["loss"]) == (want["top1"], want["loss"])
    final = [tf.train.load_checkpoint(str(d / "checkpoints" / "ckpt-100")) for d in (straight, killed)]
    names = sorted(final[0].get_variable_to_shape_map())
    assert any(name.startswith("random_states/") for name in names)
    assert sorted(final[1].get_variable_to_shape_map()) == names
    for name in names:
        if not name.startswith(("save_counter", "elapsed", "_CHECKPOINTABLE")):
            np.testing.assert_array_equal(final[1].get_tensor(name), final[0].get_tensor(name), err_msg=name)


@pytest.mark.slow
def test_multi_worker_mirrored_over_loopback(digit_shards, tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    sets = (
        "loop.strategy=multi_worker",
        "data.num_cores=2",
        "data.global_batch_size=16",
        "data.num_train_examples=400",
        "loop.train_epochs=1",
        "model.bn_group_size=2",
    )
    procs = []
    for index in range(2):
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        }
        procs.append(
            subprocess.Popen(
                _cli(tmp_path, digit_shards, *sets),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    chief = tf.train.load_checkpoint(str(tmp_path / "checkpoints"))
    other = tf.train.load_checkpoint(str(tmp_path / "workers" / "worker-1" / "checkpoints"))
    names = [n for n in chief.get_variable_to_shape_map() if n.startswith("model/")]
    assert names
    for name in names:
        np.testing.assert_array_equal(chief.get_tensor(name), other.get_tensor(name), err_msg=name)
    # Each worker read only its own training shards: together all four, no overlap.
    files = []
    for log_path in (tmp_path / "run_log.jsonl", tmp_path / "workers" / "worker-1" / "run_log.jsonl"):
        files.append(next(e["files"] for e in read_run_log(str(log_path)) if e["event"] == "train_files"))
    assert not set(files[0]) & set(files[1])
    assert len(files[0]) == len(files[1]) == 2
    with open(tmp_path / "metrics.json") as f:
        assert json.load(f)["eval_examples"] == digit_shards["num_eval"]


@pytest.mark.slow
def test_non_finite_loss_stops_with_a_clear_error_and_keeps_the_last_good_checkpoint(digit_shards, tmp_path):
    good = _config(**{"loop.train_epochs": 1})
    paths = train.RunPaths(str(tmp_path))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    train.train_and_evaluate(good, [digit_shards["train"]], [digit_shards["eval"]], paths, strategy)
    checkpoint = tf.train.latest_checkpoint(paths.checkpoint_dir)
    assert checkpoint.endswith("ckpt-50")
    # The same run continued for a second epoch with an absurd learning rate diverges.
    diverging = _config(**{"loop.train_epochs": 2, "optimizer.name": "sgd", "schedule.lr_per_256": 1e30})
    with pytest.raises(train.NonFiniteLossError, match="training loss became nan|training loss became inf"):
        train.train_and_evaluate(diverging, [digit_shards["train"]], [digit_shards["eval"]], paths, strategy)
    assert tf.train.latest_checkpoint(paths.checkpoint_dir) == checkpoint


@pytest.mark.slow
def test_weight_average_at_the_papers_decay_evaluates_close_to_the_raw_weights_and_survives_resume(
    digit_shards, tmp_path
):
    """0.9999 with the reference's warm-up: after 100 steps the average follows the recent weights (a fixed
    0.9999 would still be 99% the initial weights, and evaluate at chance)."""
    config = with_overrides(
        presets.get_preset("demo"),
        [
            "data.num_train_examples=400",
            "data.num_eval_examples=100",
            "data.global_batch_size=32",
            "loop.train_epochs=8",
            "loop.eval_every_epochs=8",
            "loop.target_top1=none",
            "schedule.warmup_epochs=1",
            "optimizer.ema_decay=0.9999",
        ],
    )
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    paths = train.RunPaths(str(tmp_path))
    metrics, trainer = train.train_and_evaluate(
        config, [digit_shards["train"]], [digit_shards["eval"]], paths, strategy
    )
    assert trainer.step == 100
    averaged = metrics.history[-1]

    def evaluate():
        files = [digit_shards["eval"]]
        plan = input_pipeline.eval_plan(files, 32)
        dataset = strategy.distribute_datasets_from_function(
            lambda ctx: input_pipeline.build_eval_dataset(
                files, ctx, input_pipeline.EvalInputs(32, config.plan.input_size)
            )
        )
        return train._evaluate(trainer, dataset, plan, config)

    raw = evaluate()
    with trainer.evaluation_weights():
        assert evaluate()["top1"] == pytest.approx(
            averaged["top1"]
        )  # the in-loop evaluation used the averages
    assert raw["top1"] > 0.3, raw  # the run learned: chance is 0.1
    assert averaged["top1"] == pytest.approx(raw["top1"], abs=0.15)
    assert averaged["loss"] == pytest.approx(raw["loss"], rel=0.5)

    # The averages are in the checkpoint and come back on resume.
    names = tf.train.load_checkpoint(paths.checkpoint_dir).get_variable_to_shape_map()
    assert sum(name.startswith("weight_average/") for name in names) == len(trainer.average.averages)
    resumed = train.Trainer(config, strategy)
    resumed.checkpoint.restore(tf.train.latest_checkpoint(paths.checkpoint_dir)).expect_partial()
    for before, after in zip(trainer.average.averages, resumed.average.averages, strict=True):
        np.testing.assert_array_equal(before.numpy(), after.numpy())


def test_thread_pools_in_a_process_whose_runtime_runs_already_keep_their_size_and_say_so(caplog):
    from trainer_module import run as runs

    tf.constant(1.0) + 1.0  # the runtime of this test process has started (as in a pipeline's process)
    before = tf.config.threading.get_intra_op_parallelism_threads()
    with caplog.at_level("WARNING", logger="trainer_module"):
        runs.size_thread_pools(before + 1)
    assert tf.config.threading.get_intra_op_parallelism_threads() == before
    assert f"loop.cpu_threads={before + 1}: TensorFlow's runtime started before the run" in caplog.text


@pytest.mark.slow
def test_thread_pools_are_sized_before_the_runtime_starts():
    probe = (
        "from trainer_module import run as runs; import tensorflow as tf; runs.size_thread_pools(1); "
        "tf.constant(1.0) + 1.0; t = tf.config.threading; "
        "print(t.get_intra_op_parallelism_threads(), t.get_inter_op_parallelism_threads())"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.split() == ["1", "1"]


@pytest.mark.slow
def test_the_training_stream_and_each_evaluation_stream_are_deleted_off_the_loops_thread(
    digit_shards, tmp_path, monkeypatch
):
    """Deleting an autotuned tf.data iterator can wait out its model thread's sleep (trainer_module.data.release):
    the loop hands its streams to the release thread, which deletes them, so the run goes on meanwhile."""
    deleted_on = []
    handed = []
    release_in_background = release.release_in_background

    def watched(holder):
        handed.append(type(holder[0]).__name__)
        weakref.finalize(holder[0], lambda: deleted_on.append(threading.current_thread().name))
        return release_in_background(holder)

    monkeypatch.setattr(release, "release_in_background", watched)
    config = _config(**{"loop.train_epochs": 2, "loop.eval_every_epochs": 1})
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    train.train_and_evaluate(
        config, [digit_shards["train"]], [digit_shards["eval"]], train.RunPaths(str(tmp_path)), strategy
    )
    deadline = time.time() + 120  # TensorFlow's wait for a pipeline's model thread: up to a minute
    while len(deleted_on) < len(handed) and time.time() < deadline:
        time.sleep(0.1)
    assert len(handed) == 3  # two evaluations' streams, then the training stream
    assert deleted_on == [release.THREAD_NAME] * 3
