"""One trial: its resolved run written to a file in the trial's directory, trained by
``python -m trainer_module train --config FILE`` as a process of its own.

A trial's directory (``trials/trial_<id>/`` of the search's) holds ``trial_run.json`` (the ``ResolvedRun`` it
trains, the same file ``train --config`` reads), ``run/`` (its model directory: checkpoints, history, run
log), ``trainer.out`` (the trainer's console output, every attempt's) and ``attempts.json`` (each attempt's
exit status, CPU and wall seconds; whether the run diverged). A trial killed with its search is run again from
its own checkpoints; a Hyperband continuation starts from a copy of its source trial's run.

In a Vertex AI job attached to a TensorBoard (``AIP_TENSORBOARD_LOG_DIR`` set: the Tuner's job), each trial
writes its summaries to a directory of its own under that one, named as its trial directory: TensorBoard shows
the trials as runs side by side.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import time

from effnet_common import stopping
from trainer_module import files
from trainer_module.profiling import VERTEX_TENSORBOARD_ENV
from trainer_module.recorder import HISTORY_FILE, METRICS_FILE, RUN_LOG_FILE, read_run_log
from trainer_module.resolve import ResolvedRun
from trainer_module.train import CHECKPOINT_DIR

RUN_FILE = "trial_run.json"  # the resolved run the trial trains (``train --config``)
RUN_DIR = "run"  # a trial's model directory, inside its trial directory
OUTPUT_FILE = "trainer.out"  # the trainer's console output
RECORD_FILE = "attempts.json"  # a trial's attempts (CPU and wall seconds, exit status) and outcome
CONTINUED_FILE = "continued_from.json"  # written once a continuing trial's copy of checkpoints is complete


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One process of a trial: its exit status, CPU seconds (user + system, its own tree) and wall seconds."""

    exit_code: int
    cpu_seconds: float
    wall_seconds: float
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a trial's attempt left: the attempt, whether the run stopped on a non-finite loss, and its in-loop
    evaluations (a continuation's include those of its source)."""

    attempt: Attempt
    diverged: bool
    evaluations: list[dict]

    @property
    def failed(self) -> bool:
        """The trainer failed (a diverged run is a result, the worst one, not a failure)."""
        return self.attempt.exit_code != 0 and not self.diverged


def train_trial(run: ResolvedRun, trial_dir: str, train_files, eval_files, cpu_devices: int = 0) -> Outcome:
    """Trains ``run`` as the trial of ``trial_dir`` (local or URL): writes its run file, runs the trainer on
    it (resuming the run's checkpoints, if any) and records the attempt."""
    model_dir = files.join(trial_dir, RUN_DIR)
    command = trainer_command(write_run_file(run, trial_dir), model_dir, train_files, eval_files, cpu_devices)
    attempt = _run_logged(command, files.join(trial_dir, OUTPUT_FILE), trial_environment(trial_dir))
    record = read_record(trial_dir)
    record["attempts"].append(dataclasses.asdict(attempt))
    record["diverged"] = attempt.exit_code != 0 and diverged(model_dir)
    files.write_json(files.join(trial_dir, RECORD_FILE), record)
    return Outcome(attempt, record["diverged"], read_evaluations(model_dir))


def trial_environment(trial_dir: str) -> dict[str, str]:
    """The variables a trial's trainer gets besides this process's: in a Vertex AI job attached to a
    TensorBoard, its own directory under the job's ``AIP_TENSORBOARD_LOG_DIR`` (else the trials would write
    one mixed run)."""
    vertex = os.environ.get(VERTEX_TENSORBOARD_ENV, "")
    if not vertex:
        return {}
    return {VERTEX_TENSORBOARD_ENV: files.join(vertex, trial_dir.rstrip("/").rsplit("/", 1)[-1])}


def write_run_file(run: ResolvedRun, trial_dir: str) -> str:
    """Writes the run a trial trains to its directory (``ResolvedRun.to_json``); returns the file's path."""
    path = files.join(trial_dir, RUN_FILE)
    files.write_text(path, run.to_json())
    return path


def trainer_command(
    run_file: str, model_dir: str, train_files, eval_files, cpu_devices: int = 0
) -> list[str]:
    """``python -m trainer_module train --config RUN_FILE ...``: the trainer on a resolved run."""
    command = [
        sys.executable,
        "-m",
        "trainer_module",
        "train",
        "--config",
        run_file,
        "--model-dir",
        model_dir,
        "--no-export",  # a trial's result is its evaluations; the chosen values are trained again
    ]
    for pattern in train_files:
        command += ["--train-files", pattern]
    for pattern in eval_files:
        command += ["--eval-files", pattern]
    if cpu_devices:
        command += ["--cpu-devices", str(cpu_devices)]
    return command


def start_from(source_dir: str, trial_dir: str) -> None:
    """A Hyperband continuation starts from a copy of its source trial's run (checkpoints, history, log),
    made once: a copy cut short by a kill is made again."""
    marker = files.join(trial_dir, CONTINUED_FILE)
    if files.exists(marker):
        return
    source, model_dir = files.join(source_dir, RUN_DIR), files.join(trial_dir, RUN_DIR)
    files.remove_tree(model_dir)
    files.copy_tree(source, model_dir, skip=("export", "logs"))
    files.write_json(marker, {"copied_from": source})


def read_record(trial_dir: str) -> dict:
    """The trial's ``attempts.json`` (no attempts yet: an empty record)."""
    path = files.join(trial_dir, RECORD_FILE)
    return files.read_json(path) if files.exists(path) else {"attempts": []}


def read_evaluations(model_dir: str) -> list[dict]:
    """The in-loop evaluations of a run: metrics.json's history when it finished, else the history it kept
    beside its checkpoints (a run that stopped on a non-finite loss)."""
    for path in (files.join(model_dir, METRICS_FILE), files.join(model_dir, CHECKPOINT_DIR, HISTORY_FILE)):
        if files.exists(path):
            saved = files.read_json(path)
            return list(saved["history"] if isinstance(saved, dict) else saved)
    return []


def diverged(model_dir: str) -> bool:
    """Whether the run stopped on a non-finite loss (its run log says so)."""
    path = files.join(model_dir, RUN_LOG_FILE)
    return files.exists(path) and any(e["event"] == "non_finite_loss" for e in read_run_log(path))


def _run_logged(command: list[str], output_path: str, env: dict[str, str] | None = None) -> Attempt:
    """One attempt (``env``: variables besides this process's); the child's console output is added to
    ``output_path`` (written from a local file when it is a URL)."""
    if files.is_local(output_path):
        return _run(command, output_path, env)
    with tempfile.TemporaryDirectory() as scratch:
        local = os.path.join(scratch, OUTPUT_FILE)
        if files.exists(output_path):
            with open(local, "w") as f:
                f.write(files.read_text(output_path))
        attempt = _run(command, local, env)
        with open(local, encoding="utf-8", errors="replace") as f:
            files.write_text(output_path, f.read())
    return attempt


def _run(command: list[str], output_path: str, env: dict[str, str] | None = None) -> Attempt:
    """``command`` as a process of its own, its output added to the local file ``output_path``. The child
    imports this very package (PYTHONPATH), wherever it was started, and dies with this process
    (``stopping.die_with_parent``, which ``python -m trainer_module`` calls as it starts)."""
    env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join(filter(None, (_package_root(), os.environ.get("PYTHONPATH")))),
    }
    os.makedirs(os.path.dirname(output_path), exist_ok=True)
    start = time.time()
    with open(output_path, "ab") as output:
        output.write(("$ " + " ".join(command) + "\n").encode())
        output.flush()
        child = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=stopping.child_environment(env)
        )
        # This child's own resource use (trials of other searches may run beside it).
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    with open(output_path, encoding="utf-8", errors="replace") as f:
        errors = [line[len("error: ") :].strip() for line in f if line.startswith("error: ")]
    return Attempt(
        child.returncode, usage.ru_utime + usage.ru_stime, time.time() - start, errors[-1] if errors else ""
    )


def _package_root() -> str:
    """The directory holding ``trainer_module``."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
