"""One search: the resolved config its trials start from, the space, the algorithm and its budget.

``Search`` holds the run's resolved config (``trainer_module.resolve``: preset, settings and the shards' sizes
already applied), never a preset name and strings to apply again. Each trial's config is that config with the
search's loop settings, the trial's values and Hyperband's stop, changed as typed values (``config.replace``)
and handed to the trial whole (``trial_run``: a ``ResolvedRun``). ``SEARCHES`` (its names declared in
``trainer_module.choices``) builds the KerasTuner oracle of each algorithm; ``hyperband_budget`` is the trials
and epochs a Hyperband search schedules, from the rule KerasTuner documents (Li et al.'s brackets).

    search = search_of_config(resolved.config, train_files, eval_files, search="hyperband", max_epochs=9)
    search.trial_run({"schedule.lr_per_256": 0.3, "tuner/epochs": 3}).config.loop.stop_at_epoch  # 3
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import keras_tuner

from trainer_module import files, resolve
from trainer_module.choices import SEARCHES
from trainer_module.config import TrainerConfig, replace
from trainer_module.resolve import SCHEDULE_EPOCHS, ResolvedRun
from trainer_module.tuning.space import Dimension, SearchSpace, check_space, default_space, space_with

OBJECTIVE = "top1"  # the peak top-1 of a trial's in-loop evaluations
SEARCH_FILE = "search.json"  # the search a directory holds (``claim_directory``)


def _objective() -> keras_tuner.Objective:
    return keras_tuner.Objective(OBJECTIVE, "max")


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
      config: the resolved config trials start from (``trainer_module.resolve.resolve_run``).
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

    config: TrainerConfig
    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    space: SearchSpace = ()
    search: str = "hyperband"
    max_epochs: int | None = None
    max_trials: int = 10
    factor: int = 3
    iterations: int = 1
    seed: int = 0
    cpu_devices: int = 0

    def base_config(self) -> TrainerConfig:
        """The config every trial starts from: ``config`` with the search's loop settings (its schedule, an
        evaluation every epoch, no target, no stop)."""
        return replace(
            self.config,
            {
                "loop.train_epochs": self.max_epochs or self.config.loop.train_epochs,
                "loop.eval_every_epochs": 1,
                "loop.target_top1": None,
                "loop.stop_at_epoch": None,
            },
        )

    def checked(self) -> Search:
        """The search with its space checked (the default space when none was given) and its epochs resolved.

        Raises:
          ValueError / TypeError: one line: an unknown search, a bad budget, or a dimension that does not fit
            the config.
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
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        values.pop("cpu_devices")
        values["config"] = self.base_config().to_dict()
        values["space"] = [d.to_dict() for d in self.space]
        return json.loads(json.dumps(values))

    def hyperparameters(self) -> keras_tuner.HyperParameters:
        """The KerasTuner space: the dimensions, and the schedule length their epoch values are shares of."""
        hp = keras_tuner.HyperParameters()
        for dimension in self.space:
            dimension.declare(hp)
        hp.Fixed(SCHEDULE_EPOCHS, self.max_epochs)
        return hp

    def trial_run(self, values: dict) -> ResolvedRun:
        """The run one trial is handed: the base config with the trial's values (recorded as the search's) and
        Hyperband's stop (``tuner/epochs``) when it falls before the end of the schedule.

        Raises:
          ValueError / TypeError: the values make an invalid config (e.g. an end LR above this trial's peak),
            naming the setting.
        """
        config = self.base_config()
        stop = values.get("tuner/epochs")
        settings = {} if stop is None or stop >= config.loop.train_epochs else {"loop.stop_at_epoch": stop}
        # A trial trains the search's own schedule: its epoch values are taken as they are.
        return resolve.resolve_run(config, settings, tuned=resolve.search_values(values))

    def planned_trials_and_epochs(self) -> tuple[int, int]:
        """(trials, trained epochs) of the whole search."""
        if self.search == "hyperband":
            return hyperband_budget(self.max_epochs, self.factor, self.iterations)
        return self.max_trials, self.max_trials * self.max_epochs


def hyperband_budget(max_epochs: int, factor: int = 3, iterations: int = 1) -> tuple[int, int]:
    """(trials, trained epochs) of a Hyperband search of ``iterations`` passes over its brackets.

    The brackets of Li et al. (JMLR 18, 2018) as KerasTuner's ``HyperbandOracle`` lays them out: one bracket
    for each s with ``factor**s <= max_epochs``, the most aggressive first; bracket s runs s + 1 rounds of
    successive halving, round i keeping ``ceil(ceil(1 + log_factor(max_epochs)) / (s + 1) * factor**(s - i))``
    trials trained to epoch ``ceil(max_epochs / factor**(s - i))``, each continuing a trial of round i - 1
    (so training only the epochs since its stop). The test suite holds it against what a real
    ``HyperbandOracle`` schedules.
    """
    first_round_size = math.ceil(1 + math.log(max_epochs, factor))
    brackets = 0
    while factor**brackets <= max_epochs:
        brackets += 1
    trials = epochs = 0
    for s in range(brackets):
        trained = 0
        for i in range(s + 1):
            size = math.ceil(first_round_size / (s + 1) * factor ** (s - i))
            stop = math.ceil(max_epochs / factor ** (s - i))
            trials += size
            epochs += size * (stop - trained)
            trained = stop
    return trials * iterations, epochs * iterations


def with_space(search: Search, changes: SearchSpace = (), only: bool = False) -> Search:
    """``search`` over the default space of its config with ``changes`` replacing or adding dimensions (or
    over ``changes`` alone with ``only``), checked (see ``Search.checked``)."""
    space = changes if only else space_with(default_space(search.base_config()), changes)
    return dataclasses.replace(search, space=space).checked()


def search_of_config(
    config: TrainerConfig, train_files, eval_files, space=(), only=False, **settings
) -> Search:
    """The checked search over ``config`` (the TFX Tuner's and the runners' ``--tune``). ``space`` holds
    'KEY=KIND:LOW:HIGH' strings or ``Dimension`` fields as dicts; ``settings`` the other fields of ``Search``.

    Raises:
      ValueError / TypeError: one line naming the setting or dimension.
    """
    changes = tuple(Dimension.of(d) for d in space)
    search = Search(config, tuple(train_files), tuple(eval_files), **settings)
    return with_space(search, changes, only)


def search_digest(search: Search) -> str:
    """A short name of what makes ``search`` that search (its ``identity``): same search, same digest."""
    return hashlib.sha256(json.dumps(search.identity(), sort_keys=True).encode()).hexdigest()[:16]


def claim_directory(search: Search, directory: str) -> None:
    """Records the search in ``directory`` (``search.json``), or checks that it is the one recorded there.

    Raises:
      ValueError: the directory holds a different search, naming what differs (settings by dotted key).
    """
    identity_path = files.join(directory, SEARCH_FILE)
    identity = search.identity()
    if not files.exists(identity_path):
        files.write_json(identity_path, identity)
        return
    saved, wanted = _flat(files.read_json(identity_path)), _flat(identity)
    changed = sorted(key for key in saved.keys() | wanted.keys() if saved.get(key) != wanted.get(key))
    if changed:
        raise ValueError(
            f"{directory} holds another search (its {', '.join(changed)} differ); give a new directory"
        )


def _flat(values: dict, prefix: str = "") -> dict:
    """A nested dict's leaves by dotted key: {'config': {'loop': {'seed': 1}}} -> {'config.loop.seed': 1}."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
