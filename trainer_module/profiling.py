"""A trace of a range of training steps with TensorFlow's profiler (``loop.profile_from_step``,
``loop.profile_steps``), written where TensorBoard's Profile tab finds it.

The profiler writes ``<TensorBoard directory>/plugins/profile/<time>/<host>.xplane.pb`` (local or ``gs://``);
``tensorboard --logdir <TensorBoard directory>`` with the tensorboard-plugin-profile package installed shows
it (trace viewer, TensorFlow op statistics, input-pipeline analysis). On Vertex AI, where the training job's
``AIP_TENSORBOARD_LOG_DIR`` names the TensorBoard instance's directory, the trace is copied there too.

The training loop runs its steps in compiled calls of many steps; a traced range is run as calls of its own,
so the trace holds exactly those steps.
"""

from __future__ import annotations

import logging
import os

import tensorflow as tf

from trainer_module import files

logger = logging.getLogger("trainer_module")

VERTEX_TENSORBOARD_ENV = "AIP_TENSORBOARD_LOG_DIR"
PROFILE_SUBDIR = ("plugins", "profile")


class StepProfiler:
    """Starts the profiler at the first traced step and stops it after the last.

    Use ``limit(step, steps)`` to cut a compiled call at the range's edges, ``before(step)`` before a call and
    ``after(step)`` after it (it returns the trace's directory when the trace ends there); ``close()`` stops a
    trace cut short by an error.
    """

    def __init__(self, first_step: int, num_steps: int, logdir: str):
        self.first, self.end, self.logdir = first_step, first_step + num_steps, logdir
        self.enabled = num_steps > 0
        self._running = False
        self._runs_before: set[str] = set()

    def limit(self, step: int, steps: int) -> int:
        """``steps`` from ``step``, fewer where a call would cross the traced range's first or last step."""
        if not self.enabled:
            return steps
        for edge in (self.first, self.end):
            if step < edge < step + steps:
                steps = edge - step
        return steps

    def before(self, step: int) -> None:
        if self.enabled and not self._running and self.first <= step < self.end:
            self._runs_before = set(_profile_runs(self.logdir))
            tf.profiler.experimental.start(self.logdir)
            self._running = True

    def after(self, step: int) -> str | None:
        """Stops the trace once ``step`` reaches the range's end; returns where it went (else None)."""
        if not (self._running and step >= self.end):
            return None
        self.close()
        new = sorted(set(_profile_runs(self.logdir)) - self._runs_before)
        where = (
            files.join(self.logdir, *PROFILE_SUBDIR, new[-1])
            if new
            else files.join(self.logdir, *PROFILE_SUBDIR)
        )
        _copy_to_vertex_tensorboard(where, self.logdir)
        return where

    def close(self) -> None:
        if self._running:
            self._running = False
            tf.profiler.experimental.stop()


def _profile_runs(logdir: str) -> list[str]:
    directory = files.join(logdir, *PROFILE_SUBDIR)
    if not tf.io.gfile.isdir(directory):
        return []
    return [name.rstrip("/") for name in tf.io.gfile.listdir(directory)]


def _copy_to_vertex_tensorboard(run_dir: str, logdir: str) -> None:
    """On Vertex AI with a TensorBoard instance attached, the trace is copied under its directory as well."""
    target_root = os.environ.get(VERTEX_TENSORBOARD_ENV, "")
    if not target_root or target_root.rstrip("/") == logdir.rstrip("/"):
        return
    target = files.join(target_root, *PROFILE_SUBDIR, run_dir.rstrip("/").rsplit("/", 1)[-1])
    files.copy_tree(run_dir, target)
    logger.info("profile: copied to %s (%s)", target, VERTEX_TENSORBOARD_ENV)
