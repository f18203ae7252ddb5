"""The step profiler: which calls it cuts, the trace it writes (local, and copied where Vertex's TensorBoard
directory is), the flag that sets it, and the run report's line; where a run's summaries go on Vertex."""

import argparse
import os

import pytest
import tensorflow as tf

from trainer_module import profiling
from trainer_module.__main__ import _step_range
from trainer_module.profiling import StepProfiler


def test_calls_are_cut_at_the_traced_ranges_edges():
    profiler = StepProfiler(first_step=10, num_steps=5, logdir="unused")
    assert profiler.limit(0, 234) == 10  # up to the first traced step
    assert profiler.limit(10, 224) == 5  # exactly the traced steps
    assert profiler.limit(15, 219) == 219
    assert profiler.limit(12, 3) == 3  # a call inside the range
    assert StepProfiler(0, 0, "unused").limit(0, 234) == 234  # nothing traced


def test_the_trace_holds_the_range_and_is_copied_to_vertexs_tensorboard_directory(tmp_path, monkeypatch):
    logdir, vertex = tmp_path / "tensorboard", tmp_path / "vertex-tensorboard"
    monkeypatch.setenv(profiling.VERTEX_TENSORBOARD_ENV, str(vertex))
    profiler = StepProfiler(first_step=2, num_steps=2, logdir=str(logdir))
    step_fn = tf.function(lambda x: tf.reduce_sum(tf.matmul(x, x)))
    written = None
    for step in range(5):
        profiler.before(step)
        step_fn(tf.ones([64, 64]))
        written = written or profiler.after(step + 1)
    profiler.close()

    assert written is not None and written.startswith(str(logdir / "plugins" / "profile"))
    traces = [name for name in os.listdir(written) if name.endswith(".xplane.pb")]
    assert traces and os.path.getsize(os.path.join(written, traces[0])) > 0
    copied = vertex / "plugins" / "profile" / os.path.basename(written) / traces[0]
    assert copied.read_bytes() == open(os.path.join(written, traces[0]), "rb").read()


def test_a_trace_cut_short_by_an_error_is_stopped():
    profiler = StepProfiler(first_step=0, num_steps=10, logdir="ram://profile-cut-short")
    profiler.before(0)
    profiler.close()
    tf.profiler.experimental.start("ram://profile-after")  # would raise if a session were still running
    tf.profiler.experimental.stop()


@pytest.mark.parametrize("text, expected", [("20-24", (20, 5)), ("0-0", (0, 1))])
def test_the_flag_reads_first_and_last_step(text, expected):
    assert _step_range(text) == expected


@pytest.mark.parametrize("text", ["20", "24-20", "a-b", "-3-4"])
def test_the_flag_refuses_what_is_not_a_range(text):
    with pytest.raises(argparse.ArgumentTypeError):
        _step_range(text)


def test_on_vertex_the_summaries_go_where_the_job_is_told_each_trial_to_a_directory_of_its_own(monkeypatch):
    """A Vertex AI job attached to a TensorBoard is told where its logs stream from (``AIP_TENSORBOARD_LOG_DIR``):
    the run writes its summaries (and traces) there unless given a directory; each trial of a search gets a
    directory of its own under it, named as its trial directory (the trials would otherwise write one run)."""
    from trainer_module.train import RunPaths
    from trainer_module.tuning import trials

    monkeypatch.delenv(profiling.VERTEX_TENSORBOARD_ENV, raising=False)
    assert RunPaths("gs://b/run").resolved_tensorboard_dir == "gs://b/run/tensorboard"
    assert trials.trial_environment("gs://b/search/trial_0003") == {}
    monkeypatch.setenv(profiling.VERTEX_TENSORBOARD_ENV, "gs://b/tensorboard/effnet/tuner/r1/logs/")
    assert RunPaths("gs://b/run").resolved_tensorboard_dir == "gs://b/tensorboard/effnet/tuner/r1/logs/"
    assert RunPaths("gs://b/run", tensorboard_dir="/tmp/tb").resolved_tensorboard_dir == "/tmp/tb"
    assert trials.trial_environment("gs://b/search/trial_0003/") == {
        profiling.VERTEX_TENSORBOARD_ENV: "gs://b/tensorboard/effnet/tuner/r1/logs/trial_0003"
    }
