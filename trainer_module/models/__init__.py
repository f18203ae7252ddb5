"""Model library: EfficientNet B0-B7 and a tiny test variant, built by `efficientnet(variant, ...)`."""

from trainer_module.models.blocks import InputNormalization
from trainer_module.models.efficientnet import (
    VARIANTS,
    VariantSpec,
    block_specs,
    efficientnet,
    variant_spec,
)

__all__ = ["VARIANTS", "InputNormalization", "VariantSpec", "block_specs", "efficientnet", "variant_spec"]
