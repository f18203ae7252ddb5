"""The search space as data: which config settings a search tunes, over which values.

A ``Dimension`` names a setting by its dotted key ('schedule.lr_per_256') and a kind: ``log`` / ``linear``
(floats), ``int`` or ``choice``. ``checked`` types its values as the config stores that setting (the field's
annotation, through ``config.setting_field``; choices given as text parse as ``--set`` parses them) and
refuses, in one line naming the key, what the config would refuse. ``default_space`` spans the settings the
paper tuned per batch size around a config's own values.

    wider = (Dimension.parse("schedule.lr_per_256=log:0.1:4"),)
    space = check_space(space_with(default_space(config), wider), config)
"""

from __future__ import annotations

import dataclasses
import typing

import keras_tuner

from effnet_common import console
from trainer_module.config import TrainerConfig, parse_setting, scaled_learning_rate, setting_field
from trainer_module.resolve import unread_setting

KINDS = ("log", "linear", "int", "choice")
# Set by the search for every trial, never tuned: a trial runs the search's schedule, evaluates every epoch
# (the oracle gets top-1 by epoch) and runs to its stop (a target would end it before Hyperband's epochs).
SEARCH_OWNED = ("loop.train_epochs", "loop.stop_at_epoch", "loop.eval_every_epochs", "loop.target_top1")


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One tuned setting.

    Attributes:
      key: the config setting, e.g. 'schedule.lr_per_256'.
      kind: 'log' (float, log-uniform), 'linear' (float, uniform), 'int' (integers in [low, high]) or
        'choice' (one of ``choices``).
      low, high: the bounds (inclusive) of 'log', 'linear' and 'int'.
      choices: the values of 'choice' (typed, or text to parse by the setting's type).
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

    @classmethod
    def of(cls, given: str | dict | Dimension) -> Dimension:
        """A dimension as a pipeline's settings give it: 'KEY=KIND:LOW:HIGH' text, a dict of the fields (the
        JSON of ``to_dict``), or a dimension."""
        if isinstance(given, Dimension):
            return given
        if isinstance(given, str):
            return cls.parse(given)
        return cls(**{**given, "choices": tuple(given.get("choices", ()))})

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values["choices"] = list(self.choices)
        return values

    def checked(self, config: TrainerConfig) -> Dimension:
        """This dimension with its values typed as ``config`` stores the setting, after checking it.

        Raises:
          ValueError: one line naming the key: unknown setting, a kind the setting's type cannot take, bounds
            out of order, a bound or choice the setting refuses, a setting this config does not read.
        """
        key = self.key
        if key in SEARCH_OWNED:
            raise ValueError(f"{key}: set by the search itself (its schedule, evaluations and stops)")
        annotation = _annotation(key)
        if self.kind not in KINDS:
            raise ValueError(f"{key}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        # Tuning a setting this config does not read would spend trials on a value nothing uses.
        unread = unread_setting(config, key)
        if unread:
            raise ValueError(unread)
        if self.kind == "choice":
            return dataclasses.replace(self, choices=self._typed_choices(config))
        allowed = typing.get_args(annotation) or (annotation,)
        wanted = int if self.kind == "int" else float
        if wanted not in allowed:
            names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
            raise ValueError(f"{key}: a {names} setting cannot be tuned as {self.kind}")
        low, high = self.low, self.high
        if low is None or high is None or not low < high:
            raise ValueError(f"{key}: bounds {low}:{high} must satisfy LOW < HIGH")
        if self.kind == "log" and low <= 0:
            raise ValueError(f"{key}: a log range needs LOW > 0, got {low}")
        if self.kind == "int" and (low != int(low) or high != int(high)):
            raise ValueError(f"{key}: int bounds must be whole numbers, got {low}:{high}")
        low, high = (_stored(config, key, wanted(bound), "bound") for bound in (low, high))
        return dataclasses.replace(self, low=low, high=high)

    def _typed_choices(self, config: TrainerConfig) -> tuple:
        key = self.key
        if not self.choices:
            raise ValueError(f"{key}: choice needs at least one value")
        typed = []
        for choice in self.choices:
            if isinstance(choice, str):
                try:
                    choice = parse_setting(key, choice)
                except ValueError as e:
                    raise ValueError(f"{key}: choice {choice!r} is refused ({console.one_line(e)})") from None
            typed.append(_stored(config, key, choice, "choice"))
        if None in typed and len(set(typed)) > 1:
            raise ValueError(f"{key}: 'none' cannot be a choice beside values (a choice holds one type)")
        return tuple(typed)

    def declare(self, hp: keras_tuner.HyperParameters) -> None:
        """Declares this (checked) dimension in a KerasTuner space. KerasTuner's ``Choice`` would keep True
        and False as 1 and 0: a choice of both is its ``Boolean``."""
        if (
            self.kind == "choice"
            and set(self.choices) == {True, False}
            and all(isinstance(c, bool) for c in self.choices)
        ):
            hp.Boolean(self.key)
        elif self.kind == "choice" and len(set(self.choices)) == 1:
            hp.Fixed(self.key, self.choices[0])
        elif self.kind == "choice":
            hp.Choice(self.key, list(self.choices))
        elif self.kind == "int":
            hp.Int(self.key, self.low, self.high)
        else:
            hp.Float(self.key, self.low, self.high, sampling="log" if self.kind == "log" else "linear")


def _annotation(key: str):
    """The annotation of a dotted setting key (``config.setting_field``); ValueError starting with the key."""
    try:
        return setting_field(key)[2]
    except ValueError as e:
        raise ValueError(f"{key}: {str(e).removeprefix(f'override {key!r}: ')}") from None


def _stored(config: TrainerConfig, key: str, value, what: str):
    """``value`` as the setting's section stores it (an int bound of a float setting as a float), after the
    section's own checks on it (cross-setting checks wait for a trial's whole config)."""
    section_name, field_name, _ = setting_field(key)
    section = getattr(config, section_name) if section_name else config
    try:
        return getattr(dataclasses.replace(section, **{field_name: value}), field_name)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{key}: {what} {value!r} is refused ({console.one_line(e)})") from None


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
    """The settings the paper tuned per batch size and the regularisers beside them, around the config's.

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
        lowest_peak = scaled_learning_rate(lr / 10, config.data.global_batch_size)
        space.append(Dimension("schedule.end_lr", "log", lowest_peak / 1000, lowest_peak))
    return tuple(space)


def space_with(space: SearchSpace, changes: SearchSpace) -> SearchSpace:
    """``space`` with each dimension of ``changes`` replacing the one of its key (or added)."""
    changed = {d.key: d for d in changes}
    return tuple(changed.pop(d.key, d) for d in space) + tuple(changed.values())
