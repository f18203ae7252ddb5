"""Hyperparameter tuning through the project's own training loop.

The paper tuned the learning rate and warmup for every batch size; a reproduction at another scale has to tune
too, every optimizer with the same budget. This module searches a declared space of config settings with
KerasTuner, training each trial exactly as ``python -m trainer_module`` does, because that is what runs it:

- ``Dimension`` / ``SearchSpace``: the space as data (config key, kind ``log`` / ``linear`` float, ``int`` or
  ``choice``, bounds), checked against the config so that an unknown key or a bad bound fails in one line
  naming it; ``default_space`` spans the peak LR per 256, LARS' trust coefficient, warmup, the polynomial end
  LR, weight decay and label smoothing around the config's own values.
- ``Search``: what to tune (preset + overrides, data, space) and how (``SEARCHES``: ``hyperband``, the
  default, ``bayesian`` or ``random``; the search's schedule length ``max_epochs``, its trial budget, seed).
- ``TrainerTuner``: a ``keras_tuner.Tuner`` whose ``run_trial`` runs one trial as its own process (a clean
  TensorFlow each time, its CPU seconds measured with ``os.wait4``), reads the trial's in-loop evaluations and
  reports each evaluation's top-1 to the oracle at its epoch; the objective is the peak top-1. Hyperband's
  ``tuner/epochs`` becomes ``loop.stop_at_epoch`` of a schedule of ``max_epochs`` epochs, and a trial that
  continues ``tuner/trial_id`` starts from a copy of that trial's checkpoints, so it resumes exactly.
- Resumable: the search keeps its state in its directory; run again there, it keeps the finished trials and
  picks up the one that was killed (from that trial's checkpoints). ``best_hyperparameters.json`` holds the
  winning values as config overrides, ``trials.json`` every trial's values, epochs, top-1 history, CPU
  seconds and status.

Epoch-denominated values (warmup, decay interval) are tuned on the search's schedule; ``hyperparameter_overrides``
scales them to the budget of the run that uses them by the same share of it (``SCHEDULE_EPOCHS``).

    search = Search(preset="demo", train_files=(...,), eval_files=(...,), space=default_space(config))
    tuner = build_tuner(search, "runs/tune")
    tuner.search()
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import typing

import keras_tuner
from keras_tuner.engine import trial as trial_module

from effnet_common import console
from effnet_common.registry import Registry
from trainer_module import files, presets
from trainer_module.config import SECTION_NAMES, TrainerConfig, _parse_value, with_overrides
from trainer_module.recorder import HISTORY_FILE, METRICS_FILE, RUN_LOG_FILE, read_run_log
from trainer_module.train import CHECKPOINT_DIR

OBJECTIVE = "top1"
BEST_HYPERPARAMETERS_FILE = "best_hyperparameters.json"
TRIALS_FILE = "trials.json"
SEARCH_FILE = "search.json"
PROJECT = "trials"  # KerasTuner's project directory under the search's directory: trial_<id>/ each
RUN_DIR = "run"  # a trial's model directory, inside its trial directory
RECORD_FILE = "attempts.json"  # a trial's attempts (CPU and wall seconds, exit status) and outcome
CONTINUED_FILE = "continued_from.json"  # written once a continuing trial's copy of checkpoints is complete
# Not a config key: the search's schedule length, carried with the values so that a run with another budget
# scales the epoch-denominated ones by the same share (a Fixed hyperparameter, so TFX's Tuner writes it too).
SCHEDULE_EPOCHS = "tuning/schedule_epochs"
EPOCH_KEYS = ("schedule.warmup_epochs", "schedule.decay_epochs")
KINDS = ("log", "linear", "int", "choice")
# Set by the search for every trial, never tuned: a trial runs the search's schedule, evaluates every epoch
# (the oracle gets top-1 by epoch) and runs to its stop (a target would end it before Hyperband's epochs).
SEARCH_OWNED = ("loop.train_epochs", "loop.stop_at_epoch", "loop.eval_every_epochs", "loop.target_top1")
# Settings only some configs read: tuning one elsewhere would spend trials on a value nothing uses.
READ_ONLY_WITH = {
    "optimizer.lars_eeta": ("optimizer.name", "lars"),
    "optimizer.lars_epsilon": ("optimizer.name", "lars"),
    "optimizer.lars_nesterov": ("optimizer.name", "lars"),
    "optimizer.rmsprop_rho": ("optimizer.name", "rmsprop"),
    "optimizer.rmsprop_epsilon": ("optimizer.name", "rmsprop"),
    "schedule.end_lr": ("schedule.kind", "polynomial"),
    "schedule.polynomial_power": ("schedule.kind", "polynomial"),
    "schedule.decay_epochs": ("schedule.kind", "exponential"),
    "schedule.decay_rate": ("schedule.kind", "exponential"),
}


# ---------------------------------------------------------------------------------------------- the space


def format_value(value) -> str:
    """A setting's value as ``--set`` text (the inverse of the config's override parsing)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _setting(config: TrainerConfig, key: str):
    """(section, field name, the field's annotation) of a dotted config key; ValueError naming it otherwise."""
    section_name, dot, field = key.rpartition(".")
    sections = {name: getattr(config, name) for name in SECTION_NAMES.values()}
    if not dot or section_name not in sections:
        raise ValueError(f"{key}: not a config setting (section.field; sections are {', '.join(sections)})")
    section = sections[section_name]
    hints = typing.get_type_hints(type(section))
    if field not in hints:
        raise ValueError(f"{key}: unknown config field; known in {section_name}: {', '.join(sorted(hints))}")
    return section, field, hints[field]


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One tuned setting.

    Attributes:
      key: the config setting, e.g. 'schedule.lr_per_256'.
      kind: 'log' (float, log-uniform), 'linear' (float, uniform), 'int' (integers in [low, high]) or
        'choice' (one of ``choices``).
      low, high: the bounds (inclusive) of 'log', 'linear' and 'int'.
      choices: the values of 'choice'.
    """

    key: str
    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple = ()

    @classmethod
    def parse(cls, text: str) -> Dimension:
        """'KEY=KIND:LOW:HIGH' or 'KEY=choice:A,B,...' (the CLI's ``--space``)."""
        key, separator, spec = text.partition("=")
        kind, _, bounds = spec.partition(":")
        if not separator or not bounds:
            raise ValueError(
                f"{text}: expected KEY=KIND:LOW:HIGH or KEY=choice:A,B,... (kinds: {', '.join(KINDS)})"
            )
        key, kind = key.strip(), kind.strip()
        if kind == "choice":
            return cls(key, kind, choices=tuple(c.strip() for c in bounds.split(",")))
        low, _, high = bounds.partition(":")
        try:
            return cls(key, kind, float(low), float(high))
        except ValueError:
            raise ValueError(f"{text}: bounds must be numbers, LOW:HIGH") from None

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values["choices"] = list(self.choices)
        return values

    def checked(self, config: TrainerConfig) -> Dimension:
        """This dimension with its values typed by the setting, after checking it against ``config``.

        Raises:
          ValueError: one line naming the key: unknown setting, a kind the setting's type cannot take, bounds
            out of order or outside what the setting accepts, a setting this config does not read.
        """
        key = self.key
        if key in SEARCH_OWNED:
            raise ValueError(f"{key}: set by the search itself (its schedule, evaluations and stops)")
        section, field, annotation = _setting(config, key)
        if self.kind not in KINDS:
            raise ValueError(f"{key}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if key in READ_ONLY_WITH:
            switch, needed = READ_ONLY_WITH[key]
            actual = getattr(_setting(config, switch)[0], switch.rpartition(".")[2])
            if actual != needed:
                raise ValueError(f"{key}: read only with {switch}={needed!r}, and this config has {actual!r}")
        allowed = typing.get_args(annotation) or (annotation,)
        if self.kind == "choice":
            if not self.choices:
                raise ValueError(f"{key}: choice needs at least one value")
            try:
                parsed = tuple(
                    _parse_value(key, c, annotation) if isinstance(c, str) else c for c in self.choices
                )
            except ValueError as e:
                raise ValueError(f"{key}: {e}") from None
            for value in parsed:
                _check_section_value(section, key, field, value)
            return dataclasses.replace(self, choices=parsed)
        wanted = int if self.kind == "int" else float
        if wanted not in allowed:
            names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
            raise ValueError(f"{key}: a {names} setting cannot be tuned as {self.kind}")
        low, high = self.low, self.high
        if low is None or high is None or not low < high:
            raise ValueError(f"{key}: bounds {low}:{high} must satisfy LOW < HIGH")
        if self.kind == "log" and low <= 0:
            raise ValueError(f"{key}: a log range needs LOW > 0, got {low}")
        if self.kind == "int":
            if low != int(low) or high != int(high):
                raise ValueError(f"{key}: int bounds must be whole numbers, got {low}:{high}")
            low, high = int(low), int(high)
        for value in (low, high):
            _check_section_value(section, key, field, value)
        return dataclasses.replace(self, low=low, high=high)

    def declare(self, hp: keras_tuner.HyperParameters) -> None:
        """Declares this dimension in a KerasTuner space."""
        if self.kind == "choice":
            hp.Choice(self.key, list(self.choices))
        elif self.kind == "int":
            hp.Int(self.key, self.low, self.high)
        else:
            hp.Float(self.key, self.low, self.high, sampling="log" if self.kind == "log" else "linear")


def _check_section_value(section, key: str, field: str, value) -> None:
    """The section's own checks on one value (cross-setting checks wait for the trial's whole config)."""
    try:
        dataclasses.replace(section, **{field: value})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{key}: bound {value!r} is refused ({console.one_line(e)})") from None


SearchSpace = tuple[Dimension, ...]


def check_space(space: SearchSpace, config: TrainerConfig) -> SearchSpace:
    """Every dimension checked against ``config`` (see ``Dimension.checked``); a key at most once."""
    keys = [d.key for d in space]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"{repeated[0]}: declared more than once")
    if not space:
        raise ValueError("the search space is empty")
    return tuple(d.checked(config) for d in space)


def default_space(config: TrainerConfig) -> SearchSpace:
    """The settings the paper tuned per batch size and the regularisers beside them, around ``config``'s values.

    A decade either side of the peak LR per 256, LARS' trust coefficient and weight decay; warmup from none
    to 30% of the schedule; label smoothing 0 to 0.2; for the polynomial schedule, an end LR between 1/1000
    of the lowest peak in the space and that peak (so every trial's end stays below its peak).
    """
    schedule, optimizer = config.schedule, config.optimizer
    lr = schedule.lr_per_256
    decay = optimizer.weight_decay or 1e-5
    space = [
        Dimension("schedule.lr_per_256", "log", lr / 10, lr * 10),
        Dimension("schedule.warmup_epochs", "linear", 0.0, 0.3 * config.loop.train_epochs),
        Dimension("optimizer.weight_decay", "log", decay / 10, decay * 10),
        Dimension("optimizer.label_smoothing", "linear", 0.0, 0.2),
    ]
    if optimizer.name == "lars":
        space.append(
            Dimension("optimizer.lars_eeta", "log", optimizer.lars_eeta / 10, optimizer.lars_eeta * 10)
        )
    if schedule.kind == "polynomial":
        lowest_peak = (lr / 10) * config.data.global_batch_size / 256
        space.append(Dimension("schedule.end_lr", "log", lowest_peak / 1000, lowest_peak))
    return tuple(space)


def space_with(space: SearchSpace, changes: SearchSpace) -> SearchSpace:
    """``space`` with each dimension of ``changes`` replacing the one of its key (or added)."""
    changed = {d.key: d for d in changes}
    return tuple(changed.pop(d.key, d) for d in space) + tuple(changed.values())


# ---------------------------------------------------------------------------------------------- values


def hyperparameter_overrides(values: dict, train_epochs: int | None = None) -> tuple[list[str], dict]:
    """The config overrides of a search's values, and the values they set.

    ``values`` is ``best_hyperparameters.json`` or the values of a KerasTuner ``HyperParameters`` config (what
    TFX's Tuner writes, its ``{"space": ..., "values": ...}`` accepted whole): KerasTuner's own ``tuner/...``
    entries are dropped. When the values carry the search's schedule length (``SCHEDULE_EPOCHS``) and
    ``train_epochs`` differs from it, epoch-denominated values are scaled by ``train_epochs / schedule
    epochs``: the same share of the budget, as the paper states warmup (5 of 350 epochs).

    Raises:
      ValueError: the values are not a JSON object.
    """
    if isinstance(values, dict) and isinstance(values.get("values"), dict):
        values = values["values"]
    if not isinstance(values, dict):
        raise ValueError(
            f"hyperparameters must be a JSON object of config settings, got {type(values).__name__}"
        )
    schedule_epochs = values.get(SCHEDULE_EPOCHS)
    tuned = {}
    for key, value in values.items():
        if key.startswith(("tuner/", "tuning/")):
            continue
        if key in EPOCH_KEYS and schedule_epochs and train_epochs and train_epochs != schedule_epochs:
            value = value * train_epochs / schedule_epochs
        tuned[key] = value
    return [f"{key}={format_value(value)}" for key, value in tuned.items()], tuned


def read_hyperparameters(path: str) -> dict:
    """The JSON object of ``path`` (local or URL); ValueError in one line when it cannot be read or parsed."""
    try:
        return json.loads(files.read_text(path))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e})") from None
    except Exception as e:  # any file system's refusal: tf.errors.NotFoundError, PermissionDenied, ...
        raise ValueError(f"{path}: cannot read it ({console.one_line(getattr(e, 'message', e))})") from None


def flat_settings(config: TrainerConfig) -> dict:
    """Every stored setting of ``config`` under its dotted key ('name', 'model.variant', ...)."""
    flat = {}
    for key, value in config.to_dict().items():
        if isinstance(value, dict):
            flat.update({f"{key}.{field}": v for field, v in value.items()})
        else:
            flat[key] = value
    return flat


def overrides_between(base: TrainerConfig, target: TrainerConfig) -> list[str]:
    """The ``--set`` overrides that turn ``base`` into ``target``."""
    before, after = flat_settings(base), flat_settings(target)
    return [f"{key}={format_value(value)}" for key, value in after.items() if before[key] != value]


# ---------------------------------------------------------------------------------------------- the search


SEARCHES = Registry("--search")


def _objective() -> keras_tuner.Objective:
    return keras_tuner.Objective(OBJECTIVE, "max")  # peak top-1 of the trial's in-loop evaluations


@SEARCHES.register("hyperband")
def _hyperband(search: Search, hp: keras_tuner.HyperParameters, seed: int):
    """Successive halving over brackets (KerasTuner's Hyperband): screens stop early at ``loop.stop_at_epoch``
    of the full schedule and the best continue from their checkpoints."""
    return keras_tuner.oracles.HyperbandOracle(
        _objective(),
        max_epochs=search.max_epochs,
        factor=search.factor,
        hyperband_iterations=search.iterations,
        seed=seed,
        hyperparameters=hp,
    )


@SEARCHES.register("bayesian")
def _bayesian(search: Search, hp: keras_tuner.HyperParameters, seed: int):
    """Gaussian-process Bayesian optimisation, every trial the whole schedule."""
    return keras_tuner.oracles.BayesianOptimizationOracle(
        _objective(), max_trials=search.max_trials, seed=seed, hyperparameters=hp
    )


@SEARCHES.register("random")
def _random(search: Search, hp: keras_tuner.HyperParameters, seed: int):
    """Random search, every trial the whole schedule."""
    return keras_tuner.oracles.RandomSearchOracle(
        _objective(), max_trials=search.max_trials, seed=seed, hyperparameters=hp
    )


@dataclasses.dataclass(frozen=True)
class Search:
    """One search: what a trial trains, over which space, with which algorithm and budget.

    Attributes:
      preset: the named config trials start from; ``overrides`` ('section.field=value') change it.
      train_files / eval_files: file patterns of the shards (trials evaluate on ``eval_files`` in the loop).
      space: the tuned dimensions (checked against the config by ``checked``); empty = ``default_space``.
      search: a name of ``SEARCHES``.
      max_epochs: the length of every trial's schedule (``loop.train_epochs``), and Hyperband's largest stop;
        None keeps the config's.
      max_trials: trials of 'bayesian' and 'random'.
      factor / iterations: Hyperband's reduction factor and how many times its brackets are run.
      seed: the search's seed (sampling); trials train with the config's ``loop.seed``.
      cpu_devices: logical CPU devices of a trial (``--cpu-devices``); 0 = none.
    """

    preset: str
    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    space: SearchSpace = ()
    search: str = "hyperband"
    max_epochs: int | None = None
    max_trials: int = 10
    factor: int = 3
    iterations: int = 1
    seed: int = 0
    cpu_devices: int = 0

    def base_config(self) -> TrainerConfig:
        """The config every trial starts from: the preset, the overrides, and the search's loop settings."""
        config = with_overrides(presets.get_preset(self.preset), self.overrides)
        epochs = self.max_epochs or config.loop.train_epochs
        owned = [f"loop.train_epochs={epochs}", "loop.eval_every_epochs=1", "loop.target_top1=none"]
        return with_overrides(config, [*owned, "loop.stop_at_epoch=none"])

    def checked(self) -> Search:
        """The search with its space checked (the default space when none was given) and its epochs resolved.

        Raises:
          ValueError: one line: an unknown search, a bad budget, or a dimension that does not fit the config.
        """
        SEARCHES.check(self.search)
        for name in ("max_trials", "factor", "iterations"):
            if getattr(self, name) < (2 if name == "factor" else 1):
                raise ValueError(f"{name}={getattr(self, name)} is too small")
        if self.max_epochs is not None and self.max_epochs < 1:
            raise ValueError(f"max_epochs={self.max_epochs} must be at least 1")
        config = self.base_config()
        space = check_space(self.space or default_space(config), config)
        return dataclasses.replace(self, space=space, max_epochs=config.loop.train_epochs)

    def identity(self) -> dict:
        """What makes two searches the same search (a directory holds one): all but where trials run."""
        values = dataclasses.asdict(self)
        values["space"] = [d.to_dict() for d in self.space]
        values.pop("cpu_devices")
        return json.loads(json.dumps(values))

    def hyperparameters(self) -> keras_tuner.HyperParameters:
        hp = keras_tuner.HyperParameters()
        for dimension in self.space:
            dimension.declare(hp)
        hp.Fixed(SCHEDULE_EPOCHS, self.max_epochs)
        return hp

    def trial_overrides(self, values: dict) -> list[str]:
        """The ``--set`` overrides of one trial: the search's, the trial's values, and Hyperband's stop.

        Raises:
          keras_tuner.errors.FailedTrialError: the values make an invalid config (e.g. an end LR above this
            trial's peak): the trial fails in one line, the search goes on.
        """
        config = self.base_config()
        tuned, _ = hyperparameter_overrides(values)
        stop = values.get("tuner/epochs")
        stop = [] if stop is None or stop >= config.loop.train_epochs else [f"loop.stop_at_epoch={stop}"]
        try:
            trial = with_overrides(config, tuned + stop)
        except (TypeError, ValueError) as e:
            raise keras_tuner.errors.FailedTrialError(console.one_line(e)) from None
        return overrides_between(presets.get_preset(self.preset), trial)

    def planned_trials_and_epochs(self) -> tuple[int, int]:
        """(trials, trained epochs) of the whole search."""
        if self.search == "hyperband":
            return hyperband_budget(self.max_epochs, self.factor, self.iterations)
        return self.max_trials, self.max_trials * self.max_epochs


def hyperband_budget(max_epochs: int, factor: int = 3, iterations: int = 1) -> tuple[int, int]:
    """(trials, trained epochs) of a Hyperband search as KerasTuner lays its brackets out; a continuation trains
    only its new epochs."""
    oracle = keras_tuner.oracles.HyperbandOracle(_objective(), max_epochs=max_epochs, factor=factor)
    trials = epochs = 0
    for bracket in range(oracle._get_num_brackets()):
        for round_num in range(bracket + 1):
            size = oracle._get_size(bracket, round_num)
            previous = oracle._get_epochs(bracket, round_num - 1) if round_num else 0
            trials += size
            epochs += size * (oracle._get_epochs(bracket, round_num) - previous)
    return trials * iterations, epochs * iterations


def with_space(search: Search, changes: SearchSpace = (), only: bool = False) -> Search:
    """``search`` over the default space of its config with ``changes`` replacing or adding dimensions (or over
    ``changes`` alone with ``only``), checked (see ``Search.checked``)."""
    space = changes if only else space_with(default_space(search.base_config()), changes)
    return dataclasses.replace(search, space=space).checked()


def search_of_config(
    config: TrainerConfig, train_files, eval_files, space=(), only=False, **settings
) -> Search:
    """The search of a whole config (the TFX Tuner's): its preset, or any when it names none, and the overrides
    that make the config from it. ``space`` holds 'KEY=KIND:LOW:HIGH' strings or ``Dimension`` fields as dicts;
    ``settings`` the other fields of ``Search``."""
    preset = config.name if config.name in presets.PRESETS else "smoke"
    overrides = tuple(overrides_between(presets.get_preset(preset), config))
    changes = tuple(
        Dimension.parse(d)
        if isinstance(d, str)
        else Dimension(**{**d, "choices": tuple(d.get("choices", ()))})
        for d in space
    )
    search = Search(preset, tuple(train_files), tuple(eval_files), overrides, **settings)
    return with_space(search, changes, only)


# ---------------------------------------------------------------------------------------------- one trial


def _die_with_parent() -> None:
    """In the trial's process before it starts: killed with the search (Linux), so a re-run search never
    finds an orphaned trial still writing to the directory it resumes."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One process of a trial: its exit status, CPU seconds (user + system, its own tree) and wall seconds."""

    exit_code: int
    cpu_seconds: float
    wall_seconds: float
    error: str = ""


def run_trainer(search: Search, model_dir: str, overrides: list[str], output_path: str) -> Attempt:
    """``python -m trainer_module`` on one trial, as a process of its own; its console output to
    ``output_path`` (a local file). The child imports this very package (PYTHONPATH), wherever it was started."""
    command = [sys.executable, "-m", "trainer_module", "--preset", search.preset, "--model-dir", model_dir]
    for pattern in search.train_files:
        command += ["--train-files", pattern]
    for pattern in search.eval_files:
        command += ["--eval-files", pattern]
    if search.cpu_devices:
        command += ["--cpu-devices", str(search.cpu_devices)]
    for override in overrides:
        command += ["--set", override]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (_package_root(), os.environ.get("PYTHONPATH")))),
    }
    os.makedirs(os.path.dirname(output_path), exist_ok=True)
    start = time.time()
    with open(output_path, "ab") as output:
        output.write(("$ " + " ".join(command) + "\n").encode())
        output.flush()
        child = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
        )
        # This child's own resource use (trials of other searches may run beside it).
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    with open(output_path, encoding="utf-8", errors="replace") as f:
        errors = [line[len("error: ") :].strip() for line in f if line.startswith("error: ")]
    return Attempt(
        child.returncode, usage.ru_utime + usage.ru_stime, time.time() - start, errors[-1] if errors else ""
    )


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


class TrainerTuner(keras_tuner.Tuner):
    """A KerasTuner tuner whose trials are runs of ``python -m trainer_module`` (see the module docstring).

    Args:
      search: the checked search.
      oracle: the oracle ``SEARCHES`` built for it.
      directory: the search's directory (local or URL): ``trials/trial_<id>/`` per trial, the summaries.
      report: called with each finished trial's summary (the CLI prints one line).
    """

    def __init__(self, search: Search, oracle, directory: str, report=None):
        self.search_settings = search
        self.report = report
        # KerasTuner prints its reload notice; the account is ours (see ``report``).
        with contextlib.redirect_stdout(io.StringIO()):
            super().__init__(oracle=oracle, directory=directory, project_name=PROJECT)
        self.oracle.verbose = 0

    def search(self, *args, **kwargs):
        super().search(*args, **kwargs)
        if not self.holds_oracle:
            return
        # The chief of a parallel search serves the oracle and runs no trial itself: its summaries come here.
        write_summaries(self)
        # TFX's Tuner lists the oracle's best ``max_trials`` trials, which Hyperband leaves unset: all of them.
        if self.oracle.max_trials is None:
            self.oracle.max_trials = len(self.oracle.trials)

    # KerasTuner prints its summaries; the pipeline's console is ours: they go to the log.
    def search_space_summary(self, extended=False):
        with contextlib.redirect_stdout(io.StringIO()) as text:
            super().search_space_summary(extended)
        logging.getLogger("trainer_module").info("%s", text.getvalue())

    def results_summary(self, num_trials=10):
        with contextlib.redirect_stdout(io.StringIO()) as text:
            super().results_summary(num_trials)
        logging.getLogger("trainer_module").info("%s", text.getvalue())

    # -- one trial

    def run_trial(self, trial, *args, **kwargs):
        values = trial.hyperparameters.values
        overrides = self.search_settings.trial_overrides(values)
        trial_dir = self.get_trial_dir(trial.trial_id)
        model_dir = files.join(trial_dir, RUN_DIR)
        if values.get("tuner/trial_id"):
            self._start_from(values["tuner/trial_id"], trial_dir)
        attempt = self._run(model_dir, overrides, files.join(trial_dir, "trainer.out"))
        record = self._record(trial_dir)
        record["attempts"].append(dataclasses.asdict(attempt))
        evaluations = read_evaluations(model_dir)
        record["diverged"] = attempt.exit_code != 0 and diverged(model_dir)
        files.write_json(files.join(trial_dir, RECORD_FILE), record)
        if attempt.exit_code and not record["diverged"]:
            raise keras_tuner.errors.FailedTrialError(
                attempt.error or f"the trainer exited {attempt.exit_code}"
            )
        # A diverged run is a result, the worst one: what it evaluated before, or chance-free zero.
        evaluations = evaluations or [{"epoch": 0.0, OBJECTIVE: 0.0}]
        # Reported one evaluation at a time, at its epoch (a continued trial's include those of its source).
        for evaluation in evaluations:
            self.oracle.update_trial(
                trial.trial_id, {OBJECTIVE: evaluation[OBJECTIVE]}, step=int(round(evaluation["epoch"]))
            )
        return {OBJECTIVE: max(e[OBJECTIVE] for e in evaluations)}

    def _run(self, model_dir: str, overrides: list[str], output_path: str) -> Attempt:
        """One attempt; the child's console output goes to ``output_path`` (written from a local file, added
        to what earlier attempts wrote)."""
        if files.is_local(output_path):
            return run_trainer(self.search_settings, model_dir, overrides, output_path)
        with tempfile.TemporaryDirectory() as scratch:
            local = os.path.join(scratch, "trainer.out")
            if files.exists(output_path):
                with open(local, "w") as f:
                    f.write(files.read_text(output_path))
            attempt = run_trainer(self.search_settings, model_dir, overrides, local)
            with open(local, encoding="utf-8", errors="replace") as f:
                files.write_text(output_path, f.read())
        return attempt

    def _start_from(self, source_id: str, trial_dir: str) -> None:
        """A Hyperband continuation starts from a copy of its source trial's run (checkpoints, history, log),
        made once: a copy cut short by a kill is made again."""
        marker = files.join(trial_dir, CONTINUED_FILE)
        if files.exists(marker):
            return
        model_dir = files.join(trial_dir, RUN_DIR)
        files.remove_tree(model_dir)
        source = files.join(self.get_trial_dir(source_id), RUN_DIR)
        files.copy_tree(source, model_dir, skip=("export", "logs"))
        files.write_json(marker, {"trial_id": source_id})

    def _record(self, trial_dir: str) -> dict:
        path = files.join(trial_dir, RECORD_FILE)
        return files.read_json(path) if files.exists(path) else {"attempts": []}

    # -- the account

    @property
    def holds_oracle(self) -> bool:
        """Whether this process holds the search's oracle (not a worker of a parallel search, whose oracle is
        a client of the chief's)."""
        return isinstance(self.oracle, keras_tuner.Oracle)

    def on_trial_end(self, trial):
        super().on_trial_end(trial)  # the oracle scores and saves the trial
        summary = self.trial_summary(self.oracle.get_trial(trial.trial_id))
        if self.holds_oracle:
            write_summaries(self)
        if self.report:
            self.report(summary)

    def trial_summary(self, trial) -> dict:
        """One trial: its values, epochs, top-1 history, CPU seconds and status."""
        values = trial.hyperparameters.values
        trial_dir = self.get_trial_dir(trial.trial_id)
        record = self._record(trial_dir)
        history = [
            {"epoch": h["epoch"], "step": h.get("step"), OBJECTIVE: h[OBJECTIVE]}
            for h in read_evaluations(files.join(trial_dir, RUN_DIR))
        ]
        status = trial.status.lower()
        if status == "completed" and record.get("diverged"):
            status = "diverged"
        message = console.one_line(trial.message.strip().splitlines()[-1]) if trial.message else ""
        return {
            "trial_id": trial.trial_id,
            "status": status,
            "values": {k: v for k, v in values.items() if not k.startswith(("tuner/", "tuning/"))},
            "continued_from": values.get("tuner/trial_id"),
            "initial_epoch": values.get("tuner/initial_epoch", 0),
            "epochs": values.get("tuner/epochs", self.search_settings.max_epochs),
            "top1": trial.score,
            "best_epoch": trial.best_step if trial.score is not None else None,
            "history": history,
            "cpu_seconds": sum(a["cpu_seconds"] for a in record["attempts"]),
            "wall_seconds": sum(a["wall_seconds"] for a in record["attempts"]),
            "attempts": len(record["attempts"]),
            "message": message.partition(": ")[2] if message.startswith("keras_tuner") else message,
        }


def write_summaries(tuner: TrainerTuner) -> dict | None:
    """``trials.json`` (the search and every trial) and ``best_hyperparameters.json`` (the best completed
    trial's values as config overrides, with the search's schedule length) in the search's directory;
    returns the best trial's summary (None while no trial has completed)."""
    oracle = tuner.oracle
    trials = [tuner.trial_summary(oracle.trials[i]) for i in oracle.start_order if i in oracle.trials]
    best = [t for t in oracle.get_best_trials(1) if t.status == trial_module.TrialStatus.COMPLETED]
    summary = {"search": tuner.search_settings.identity(), "best_trial": best[0].trial_id if best else None}
    files.write_json(files.join(tuner.directory, TRIALS_FILE), {**summary, "trials": trials})
    if not best:
        return None
    values = {k: v for k, v in best[0].hyperparameters.values.items() if not k.startswith("tuner/")}
    files.write_json(files.join(tuner.directory, BEST_HYPERPARAMETERS_FILE), values)
    return next(t for t in trials if t["trial_id"] == best[0].trial_id)


def claim_directory(search: Search, directory: str) -> None:
    """Records the search in ``directory`` (``search.json``), or checks that it is the one recorded there.

    Raises:
      ValueError: the directory holds a different search (another space, budget, preset or data).
    """
    identity_path = files.join(directory, SEARCH_FILE)
    if not files.exists(identity_path):
        files.write_json(identity_path, search.identity())
        return
    saved, identity = files.read_json(identity_path), search.identity()
    if saved != identity:
        changed = sorted(k for k in identity if saved.get(k) != identity[k])
        raise ValueError(
            f"{directory} holds another search (its {', '.join(changed)} differ); give a new directory"
        )


def search_digest(search: Search) -> str:
    """A short name of what makes ``search`` that search (its ``identity``): same search, same digest."""
    import hashlib

    return hashlib.sha256(json.dumps(search.identity(), sort_keys=True).encode()).hexdigest()[:16]


def build_tuner(search: Search, directory: str, report=None) -> TrainerTuner:
    """The tuner of a checked search in ``directory``: a new search, or the one the directory holds (its
    finished trials kept, a killed one resumed).

    Raises:
      ValueError: the directory holds a different search (another space, budget, preset or data).
    """
    claim_directory(search, directory)
    # KerasTuner takes 0 for "no seed" and draws one: the search's seed 0 is the oracle's 1.
    oracle = SEARCHES.build(search.search, search, search.hyperparameters(), search.seed + 1)
    return TrainerTuner(search, oracle, directory, report)


def values_text(summary: dict) -> str:
    """A trial's values, short: 'lr_per_256=0.41 warmup_epochs=1.2 ...'."""
    return " ".join(f"{k.rpartition('.')[2]}={_short(v)}" for k, v in summary["values"].items())


def trial_line(summary: dict) -> str:
    """One line of the CLI's account of a trial."""
    values = values_text(summary)
    epochs = f"epochs {summary['initial_epoch']}-{summary['epochs']}"
    if summary["continued_from"]:
        epochs += f" (from trial {summary['continued_from']})"
    top1 = (
        "" if summary["top1"] is None else f"top-1 {summary['top1']:.4f} at epoch {summary['best_epoch']}  "
    )
    cpu = f"CPU {summary['cpu_seconds']:.0f}s"
    tail = f"  ({summary['message']})" if summary["message"] else ""
    return f"trial {summary['trial_id']} {summary['status']:<9} {top1}{epochs}  {cpu}  {values}{tail}"


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def planned_budget_line(search: Search) -> str:
    trials, epochs = search.planned_trials_and_epochs()
    how = f"factor {search.factor}" if search.search == "hyperband" else f"{search.max_trials} trials"
    return (
        f"{search.search} search ({how}) of schedules of {search.max_epochs} epochs over "
        f"{len(search.space)} settings: about {trials} trials, {epochs} epochs of training"
    )
