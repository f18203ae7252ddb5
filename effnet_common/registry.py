"""Named choices of the config (optimizer, schedule, strategy, batch-norm layout, ...): one registry each.

A registry is the one place that knows which names a setting accepts and how to build the object a name
stands for, so the config's validation and the builder can never disagree and no error message repeats the
list of names by hand::

    OPTIMIZERS = Registry("optimizer.name")

    @OPTIMIZERS.register("lars")
    def _lars(section, schedule): ...

    OPTIMIZERS.check("adam")            # ValueError: optimizer.name='adam' is not one of 'lars', ...
    OPTIMIZERS.build("lars", section, schedule)
"""

from __future__ import annotations

from collections.abc import Callable


class Registry:
    """Names of one config setting, each bound to the function that builds what it names.

    Args:
      setting: the dotted config key the names are values of (for error messages), e.g. 'schedule.kind'.
      declared: the accepted names, declared where the config can read them without importing the builders
        (``trainer_module.choices``); a builder registers under a declared name only. None: the names are
        those registered.
    """

    def __init__(self, setting: str, declared: tuple[str, ...] | None = None):
        self.setting = setting
        self.declared = declared
        self._builders: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[Callable], Callable]:
        """Decorator binding ``name`` to the decorated builder; a name is registered once."""

        def bind(builder: Callable) -> Callable:
            if name in self._builders:
                raise ValueError(f"{self.setting}: {name!r} is registered twice")
            if self.declared is not None and name not in self.declared:
                raise ValueError(f"{self.setting}: {name!r} is not declared (declared: {self.declared})")
            self._builders[name] = builder
            return builder

        return bind

    def names(self) -> tuple[str, ...]:
        """The accepted names: the declared ones, else those registered, in order."""
        return self.declared if self.declared is not None else tuple(self._builders)

    def unbuilt(self) -> tuple[str, ...]:
        """Declared names no builder is registered under (none once the builders' modules are imported)."""
        return tuple(name for name in self.names() if name not in self._builders)

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __iter__(self):
        return iter(self.names())

    def check(self, name: str) -> None:
        """Raises ValueError naming the setting and the accepted names when ``name`` is not one of them."""
        if name not in self.names():
            accepted = ", ".join(repr(n) for n in self.names())
            raise ValueError(f"{self.setting}={name!r} is not one of {accepted}")

    def get(self, name: str) -> Callable:
        """The builder bound to ``name`` (checked)."""
        self.check(name)
        if name not in self._builders:
            raise LookupError(f"{self.setting}={name!r}: its builder's module is not imported")
        return self._builders[name]

    def build(self, name: str, *args, **kwargs):
        """Calls the builder bound to ``name`` with the given arguments."""
        return self.get(name)(*args, **kwargs)
