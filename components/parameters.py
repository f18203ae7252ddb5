"""The runtime parameters of the pipeline's components, declared once (no TFX import: the runners read them
before anything heavy loads).

- the sharding step (``components.imagenet_shards``): its inputs and shard layout replace the config's fields
  of the same name when given;
- the Trainer and Evaluator (``components.runtime_gate``): ``train_epochs`` and ``target_top1``, the one
  target that both stops the training and gates the blessing.

A compiled pipeline exposes them all as root parameters (``pipeline.compiler.RUNTIME_PARAMETERS``).
"""

INPUT_PARAMETERS = {"train_archive": str, "val_archive": str, "train_dir": str, "val_dir": str}
LAYOUT_PARAMETERS = {"train_shards": int, "val_shards": int}
SHARDING_PARAMETERS = {**INPUT_PARAMETERS, **LAYOUT_PARAMETERS}

# Why the sharding step of a pipeline needs an input for each split (the sharding command alone may shard
# one).
BOTH_SPLITS = "the pipeline trains on the training split and gates on the validation split"

TRAIN_EPOCHS_KEY = "train_epochs"
TARGET_TOP1_KEY = "target_top1"
RUN_PARAMETERS = {TRAIN_EPOCHS_KEY: int, TARGET_TOP1_KEY: float}

# The metric the top-1 gate is a threshold of: TFMA's metric class, and the key its value is reported under.
TOP1_METRIC = "SparseCategoricalAccuracy"
TOP1_KEY = "sparse_categorical_accuracy"
