"""A run resolved once: the preset, a search's values, the person's settings, the target and the data's
manifest, turned into the one config every later step reads its facts from.

In order, later ones winning: the preset's config; a hyperparameter search's values (epoch values scaled to
this run's epochs, as shares of its schedule); the person's settings (``--set``); the run's target top-1 (the
trainer's stop and, in a pipeline, the Evaluator's gate); the sizes and classes of the shards' manifests (a
preset's epoch is then a pass over the data, and its classifier has one output per class of the shards).

``ResolvedRun`` holds the result: its config (its ``loop.target_top1`` is the run's target, its
``data.num_train_examples`` the epoch) and the search's values that stayed. It is written as a file that a
trial, a tuned run or ``python -m trainer_module train --config FILE`` is handed whole.

Resolving loads no TensorFlow: ``trainer_module.files`` (gfile) is imported by the functions that read a
file, so that the commands refuse a misspelt preset or setting before TensorFlow loads (docs/performance.md,
"a refusal of a misspelt flag").
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping

from trainer_module.config import TrainerConfig, replace, setting

logger = logging.getLogger("trainer_module")

# The search's schedule length, recorded beside its values; epoch settings are shares of it.
SCHEDULE_EPOCHS = "tuning/schedule_epochs"
EPOCH_KEYS = ("schedule.warmup_epochs", "schedule.decay_epochs")
# Keys of a search's bookkeeping, not settings: KerasTuner's ``tuner/...`` and ours.
_BOOKKEEPING = ("tuner/", "tuning/")
# The settings that decide what a search's values mean (a peak LR per 256 found for LARS is no RMSProp LR, a
# warmup found for one schedule no warmup for another), recorded beside the values it found.
SEARCHED_WITH = ("optimizer.name", "schedule.kind")
SEARCHED_WITH_KEY = "tuning/searched_with"
# Settings only some configs read, and the setting that decides it.
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


def unread_setting(config: TrainerConfig, key: str) -> str | None:
    """Why ``config`` does not read setting ``key`` (one line naming both), or None when it does."""
    if key not in READ_ONLY_WITH:
        return None
    switch, needed = READ_ONLY_WITH[key]
    actual = setting(config, switch)
    return (
        None
        if actual == needed
        else f"{key}: read only with {switch}={needed!r}, and this config has {actual!r}"
    )


def searched_with(config: TrainerConfig) -> dict[str, object]:
    """What a search's values mean with: ``SEARCHED_WITH`` of the config it searched (its record's entry)."""
    return {key: setting(config, key) for key in SEARCHED_WITH}


def check_search_applies(values: Mapping, config: TrainerConfig) -> None:
    """A search's values (``best_hyperparameters.json``) apply to ``config`` only with the optimizer and
    schedule they were found with: refused otherwise, as a search of this config would refuse those
    dimensions.

    Raises:
      ValueError: one line naming the setting that differs (or, for values recorded before searches recorded
        it, a setting this config does not read).
    """
    if isinstance(values, Mapping) and isinstance(values.get("values"), Mapping):
        values = values["values"]
    for key, value in (values.get(SEARCHED_WITH_KEY) or {}).items():
        if setting(config, key) != value:
            raise ValueError(
                f"found by a search with {key}={value!r}, and this run has {setting(config, key)!r}: its "
                "values (the peak LR, warmup, ...) mean something else there; search with this run's settings"
            )
    for key in search_values(values):
        unread = unread_setting(config, key)
        if unread:
            raise ValueError(f"found by a search of another optimizer or schedule: {unread}")


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


@dataclasses.dataclass(frozen=True)
class DataSizes:
    """What the shards say of themselves: examples per split and, where their manifest lists them, classes."""

    num_train_examples: int
    num_eval_examples: int
    num_classes: int | None = None

    def settings(self) -> dict[str, int]:
        values = {
            "data.num_train_examples": self.num_train_examples,
            "data.num_eval_examples": self.num_eval_examples,
        }
        if self.num_classes is not None:
            values["model.num_classes"] = self.num_classes
        return values


def data_sizes(train_files, eval_files, manifests_only: bool = False) -> DataSizes | None:
    """The sizes and classes of the shards (``--train-files`` / ``--eval-files`` globs).

    Counts come from the shards' manifests; shards without one are counted by reading them, unless
    ``manifests_only`` (a check before any work: nothing is read end to end), which returns None for them.

    Raises:
      ValueError: a pattern that matches nothing, or a manifest that does not describe the files beside it.
    """
    from trainer_module import files
    from trainer_module.data import shard_files

    train_list, eval_list = shard_files.list_files(train_files), shard_files.list_files(eval_files)
    if manifests_only and not all(
        files.exists(path) for path in {shard_files.manifest_path_of(f) for f in train_list + eval_list}
    ):
        return None
    classes = shard_files.shard_classes(train_list)
    return DataSizes(
        num_train_examples=sum(shard_files.record_counts(train_list)),
        num_eval_examples=sum(shard_files.record_counts(eval_list)),
        num_classes=None if classes is None else len(classes),
    )


def search_values(values: Mapping, train_epochs: int | None = None) -> dict[str, object]:
    """The settings of a search's values (``best_hyperparameters.json``, or a KerasTuner ``HyperParameters``
    config ``{"space": ..., "values": ...}``), typed as they are; bookkeeping entries dropped.

    When the values carry the search's schedule length (``SCHEDULE_EPOCHS``) and ``train_epochs`` differs,
    epoch-denominated settings are scaled by ``train_epochs / schedule epochs``: the same share of the budget,
    as the paper states warmup (5 of 350 epochs).

    Raises:
      ValueError: the values are not a JSON object.
    """
    if isinstance(values, Mapping) and isinstance(values.get("values"), Mapping):
        values = values["values"]
    if not isinstance(values, Mapping):
        raise ValueError(
            f"hyperparameters must be a JSON object of config settings, got {type(values).__name__}"
        )
    schedule_epochs = values.get(SCHEDULE_EPOCHS)
    settings = {}
    for key, value in values.items():
        if key.startswith(_BOOKKEEPING):
            continue
        if key in EPOCH_KEYS and schedule_epochs and train_epochs and train_epochs != schedule_epochs:
            value = value * train_epochs / schedule_epochs
        settings[key] = value
    return settings


def read_hyperparameters(path: str) -> dict:
    """The JSON object of ``path`` (local or URL); ValueError in one line when it cannot be read or parsed."""
    from trainer_module import files

    try:
        return json.loads(files.read_text(path))
    except Exception as e:  # noqa: BLE001 (a missing file, no permission, bad JSON: one line each)
        raise ValueError(f"cannot read {path}: {e}") from None


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
    """A run's config with every source applied, and the settings in it that came from a search.

    Attributes:
      config: what the run trains with; its facts have names of their own below.
      tuned: the search's values that stayed (a setting the person gave wins over the search's).
    """

    config: TrainerConfig
    tuned: Mapping[str, object] = dataclasses.field(default_factory=dict)

    @property
    def target_top1(self) -> float | None:
        """The run's one target: the trainer stops once reached; a pipeline blesses a model only at it."""
        return self.config.loop.target_top1

    @property
    def epoch_size(self) -> int:
        """Training examples per epoch (the shards' manifest's, once resolved against the data)."""
        return self.config.data.num_train_examples

    def with_data(self, data: DataSizes | None) -> ResolvedRun:
        """The same run against the shards it trains on (nothing changes for None or equal sizes)."""
        return resolve_run(self.config, data=data, tuned=self.tuned) if data is not None else self

    def to_json(self) -> str:
        """The file a trial or a tuned run is handed (``train --config``), the same shape as a run's
        config.json: ``{"config": ..., "tuned": ...}``."""
        return json.dumps(
            {"config": self.config.to_dict(), "tuned": dict(self.tuned)}, indent=2, sort_keys=True
        )

    @classmethod
    def from_json(cls, text: str) -> ResolvedRun:
        """Reads ``to_json``'s file, a run's config.json or a bare config; ValueError naming what is wrong."""
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"not valid JSON: {error}") from None
        if not isinstance(values, dict):
            raise ValueError("expected a JSON object: a trainer config or a run's config.json")
        if "config" in values:
            return cls(TrainerConfig.from_dict(values["config"]), values.get("tuned") or {})
        return cls(TrainerConfig.from_dict(values))


def resolve_run(
    base: TrainerConfig,
    settings: Mapping[str, object] | None = None,
    *,
    hyperparameters: Mapping | None = None,
    target_top1: float | None | _Unset = UNSET,
    data: DataSizes | None = None,
    tuned: Mapping[str, object] | None = None,
) -> ResolvedRun:
    """The run of ``base`` (a preset's config) with a search's ``hyperparameters``, the person's ``settings``
    (typed values by dotted key), the given ``target_top1`` (UNSET: the config's) and the shards' ``data``,
    checked once with everything applied (a batch larger than the preset's own data is valid on larger
    shards). ``tuned``: search values already in ``base`` (a resolved run's, resolved again).

    Raises:
      ValueError / TypeError: a setting or value the config refuses, naming its key.
    """
    settings = dict(settings or {})
    tuned = dict(tuned or {})
    if hyperparameters is not None:
        epochs = settings.get("loop.train_epochs", base.loop.train_epochs)  # the run's epochs
        found = search_values(hyperparameters, epochs)
        tuned.update({k: v for k, v in found.items() if k not in settings})
    changes = {**tuned, **settings}
    if not isinstance(target_top1, _Unset):
        changes["loop.target_top1"] = target_top1
    for key, value in (data.settings() if data else {}).items():
        said = changes.get(key, setting(base, key))
        if said != value:
            logger.info("%s=%d from the shards (the config said %d)", key, value, said)
            changes[key] = value
    config = replace(base, changes) if changes else base
    if hyperparameters is not None:
        check_search_applies(hyperparameters, config)
    return ResolvedRun(config, tuned)
