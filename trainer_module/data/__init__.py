"""What feeds a host: the per-host tf.data input pipelines for training and evaluation (``input_pipeline``),
the shard files a run reads and how they are dealt out to the pipelines (``shard_files``), the evaluation plan
that gives every replica the same step count (``eval_plan``), the label check against the shards' classes
(``labels``), and the per-image crop, decode, resize and flip (``preprocessing``) with AutoAugment and
RandAugment (``augment``); a finished iterator let go of without waiting for it (``release``)."""
