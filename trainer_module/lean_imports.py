"""Keep a training process's imports to what training uses: IPython, pandas and scikit-learn are refused in
the process of ``python -m trainer_module train`` (and ``report``).

Keras imports each of them when it is installed, inside ``try: ... except ImportError``, while TensorFlow
imports it: IPython for notebook display (``keras.saving``), pandas to slice DataFrames given to ``fit``,
scikit-learn for its estimator wrappers (``keras.wrappers``). TFX's dependencies install all three, and a run
trains from tf.data pipelines, so it uses none; refusing them shortens the start of every trial of a search,
every host of a slice and every run of the command (docs/performance.md, "a trainer process's imports").
matplotlib's ``pyplot``, which Keras imports too, stays: the run report draws with it.

The search (``tune``) keeps them: KerasTuner is its library, and its trials are ``train`` processes.
"""

from __future__ import annotations

from effnet_common import refused_imports

REFUSED = ("IPython", "pandas", "sklearn")
KEEPS_THEM = ("tune",)


def wanted(argv: list[str]) -> bool:
    """Whether the command line ``argv`` (without the program) runs a subcommand that refuses them."""
    return not (argv[:1] and argv[0] in KEEPS_THEM)


def install() -> bool:
    """Refuses the packages from now on; returns False (and changes nothing) if one is already imported."""
    return refused_imports.refuse(REFUSED, "python -m trainer_module")
