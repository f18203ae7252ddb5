"""The EfficientNet variants' compound scaling, as data (no TensorFlow: the config reads it).

``trainer_module.models.efficientnet`` builds a network from a variant's row; the config takes a variant's
native resolution and dropout from it.
"""

from __future__ import annotations

import dataclasses
import types


@dataclasses.dataclass(frozen=True)
class VariantSpec:
    """Compound scaling of one variant.

    Attributes:
        name: 'b0'..'b7', 'tiny' or 'micro'.
        width: multiplier of every filter count (then rounded to multiples of 8).
        depth: multiplier of every stage's repeats (then rounded up).
        resolution: native input side in pixels.
        dropout: dropout rate before the dense head.
        stages: how many of B0's stages the network keeps, from the first; None (every variant but the
            plumbing tests' network) keeps them all.
    """

    name: str
    width: float
    depth: float
    resolution: int
    dropout: float
    stages: int | None = None


VARIANTS = types.MappingProxyType(
    {
        spec.name: spec
        for spec in (
            VariantSpec("b0", width=1.0, depth=1.0, resolution=224, dropout=0.2),
            VariantSpec("b1", width=1.0, depth=1.1, resolution=240, dropout=0.2),
            VariantSpec("b2", width=1.1, depth=1.2, resolution=260, dropout=0.3),
            VariantSpec("b3", width=1.2, depth=1.4, resolution=300, dropout=0.3),
            VariantSpec("b4", width=1.4, depth=1.8, resolution=380, dropout=0.4),
            VariantSpec("b5", width=1.6, depth=2.2, resolution=456, dropout=0.4),
            VariantSpec("b6", width=1.8, depth=2.6, resolution=528, dropout=0.5),
            VariantSpec("b7", width=2.0, depth=3.1, resolution=600, dropout=0.5),
            # For the CPU digits demo and the tests of learning: 10 blocks (residual, SE and drop-connect
            # included) at 32 px.
            VariantSpec("tiny", width=0.25, depth=0.5, resolution=32, dropout=0.2),
            # For the tests of plumbing (the smoke preset: distribution, resume, the console, the cloud
            # steps), which check that a run goes through, not what it learns: B0's first two stages at tiny's
            # width, 3 blocks (one residual, with SE and drop-connect). Tracing and exporting it, most of a
            # short run's time, cost a fraction of tiny's (why: docs/training.md, "models/variants.py").
            VariantSpec("micro", width=0.25, depth=1.0, resolution=32, dropout=0.2, stages=2),
        )
    }
)


def variant_spec(variant: str) -> VariantSpec:
    """The scaling of `variant` ('b0'..'b7', 'tiny' or 'micro'); ValueError naming the known variants
    otherwise."""
    try:
        return VARIANTS[variant]
    except (KeyError, TypeError):
        raise ValueError(
            f"Unknown EfficientNet variant {variant!r}; known variants: {sorted(VARIANTS)}"
        ) from None
