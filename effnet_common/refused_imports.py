"""Optional packages a command's process never uses, refused so that the libraries that import them "if
installed" skip them (``refuse``).

Beam, TensorFlow and Keras import optional packages when they are installed, each inside ``try: ... except
ImportError``, whether or not the process will use them; TFX's dependencies install most of them here. A
finder at the front of ``sys.meta_path`` raises ``ModuleNotFoundError`` for exactly the refused packages and
their submodules, so those imports take their ``except ImportError`` branch, as on a machine without the
packages. Only a command's own process refuses (``python -m beam_preprocess``, ``python -m trainer_module
train``), before the libraries are imported; a library caller (TFX's executors, a test's process) never does.
"""

from __future__ import annotations

import importlib.abc
import sys


class _RefuseFinder(importlib.abc.MetaPathFinder):
    """Raises ModuleNotFoundError for the refused packages and their submodules; every other import is
    untouched."""

    def __init__(self, refused: tuple[str, ...], owner: str):
        self.refused = refused
        self.owner = owner
        self._prefixes = tuple(name + "." for name in refused)

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.refused or fullname.startswith(self._prefixes):
            raise ModuleNotFoundError(
                f"{fullname} is not imported by {self.owner} (refused_imports)", name=fullname
            )
        return None


def refuse(names: tuple[str, ...], owner: str) -> bool:
    """Refuses ``names`` (and their submodules) in this process from now on; an import of one then fails
    naming ``owner``. Returns True if they are refused (or a refusal is in place already), False (changing
    nothing) if one of them is imported already."""
    if any(isinstance(finder, _RefuseFinder) for finder in sys.meta_path):
        return True
    if any(name in sys.modules for name in names):
        return False  # too late: something imported it already, and refusing would split the process
    sys.meta_path.insert(0, _RefuseFinder(names, owner))
    return True
