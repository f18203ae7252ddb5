"""Per-host tf.data input pipelines for training and in-loop evaluation (docs/recipe.md, "The data and the
input pipeline"). Both builders run inside ``strategy.distribute_datasets_from_function``::

    train = strategy.distribute_datasets_from_function(
        lambda ctx: build_train_dataset(files, ctx, TrainInputs(global_batch_size, image_size, seed=seed)))
    plan = eval_plan(val_files, eval_batch_size, tf.distribute.InputContext(num_pipelines, 0, replicas))
    evals = strategy.distribute_datasets_from_function(
        lambda ctx: build_eval_dataset(val_files, ctx, EvalInputs(eval_batch_size, image_size)))

Each input pipeline (one per host) lists the files in sorted order and keeps every ``num_input_pipelines``-th
file from its own id, so a host never reads another host's shards. Batches are per-replica batches
(``ctx.get_per_replica_batch_size``) with ``drop_remainder=True``; every pipeline yields the same number of
evaluation steps (collectives need it), and together they cover each validation record once. Shards must be
JPEG records of the ``effnet_common.schema`` contract (that stage re-encodes PNG and CMYK).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from effnet_common import schema
from trainer_module.config import (  # noqa: F401
    EVAL_CROP_FRACTION,
    AugmentConfig,
    TrainerConfig,
    eval_crop_padding,
)

# The input pipeline's parts, one subject a module; their names are the input pipeline's API too.
from trainer_module.data.eval_plan import EvalPlan, eval_plan  # noqa: F401
from trainer_module.data.labels import (  # noqa: F401
    LABEL_CHECK_MARK,
    LabelChecker,
    LabelError,
    raise_label_error,
)
from trainer_module.data.preprocessing import (  # noqa: F401
    CROP_AREA_RANGE,
    center_crop_window,
    decode_crop,
    preprocess_for_eval,
    preprocess_for_train,
    resize,
    train_crop_window,
)
from trainer_module.data.shard_files import (  # noqa: F401
    FilePatterns,
    _context,
    list_files,
    manifest_path_of,
    num_examples,
    pipeline_files,
    read_manifest,
    record_counts,
    replicas_per_pipeline,
    shard_classes,
)

# Element keys of evaluation batches.
IMAGES = "images"
LABELS = "labels"
MASK = "mask"
FILENAMES = "filenames"

PADDING_LABEL = -1

TFRECORD_READ_BUFFER = 8 * 2**20  # bytes read ahead per open shard


def _features(with_filename: bool) -> dict[str, tf.io.FixedLenFeature]:
    features = {
        schema.IMAGE_ENCODED: tf.io.FixedLenFeature([], tf.string),
        schema.LABEL: tf.io.FixedLenFeature([], tf.int64),
        schema.SYNSET: tf.io.FixedLenFeature([], tf.string, default_value=""),
    }
    if with_filename:
        features[schema.FILENAME] = tf.io.FixedLenFeature([], tf.string, default_value="")
    return features


def parse_example(record: tf.Tensor, with_filename: bool = False) -> dict[str, tf.Tensor]:
    """The JPEG bytes, the int64 label, the synset (and file name) of one serialised ``tf.train.Example``."""
    return tf.io.parse_single_example(record, _features(with_filename))


def parse_examples(records: tf.Tensor) -> dict[str, tf.Tensor]:
    """``parse_example`` of a vector of records at once: each feature a vector, in the records' order."""
    return tf.io.parse_example(records, _features(with_filename=False))


# --------------------------------------------------------------------------------------------------
# The datasets.


@dataclasses.dataclass(frozen=True)
class TrainInputs:
    """How a training stream is read and prepared.

    Attributes:
      global_batch_size: training examples per step over all replicas.
      image_size: the model resolution S.
      seed: makes the stream reproducible (file order, shuffle, crops and flips), as a resumable run needs;
        implies deterministic ordering. None draws fresh randomness.
      deterministic: keep element order fixed even without a seed; the default lets parallel stages emit
        out of order, which is faster.
      shuffle_buffer_size: records in the shuffle buffer (encoded JPEGs: about 110 KB each on ImageNet).
      cycle_length: files read in parallel.
      fused_decode_crop: decode only the crop window (see ``decode_crop``); False is the benchmark baseline.
      skip_records: records of the stream already consumed (a resumed run); with a seed, the stream then
        continues exactly where it stopped. They are skipped before decoding, so skipping is cheap.
      min_crop_area, random_flip, augmentation: see ``preprocess_for_train``.
      clip_resized: see ``resize``.
      label_offset, num_classes, synsets: see ``LabelChecker``.
      threads: threads of the pipeline's own tf.data pool and its autotuning budget; 0 = tf.data's default
        (every core). See ``loop.cpu_threads``.
    """

    global_batch_size: int
    image_size: int
    seed: int | None = None
    deterministic: bool = False
    shuffle_buffer_size: int = 2048
    cycle_length: int = 16
    fused_decode_crop: bool = True
    skip_records: int = 0
    min_crop_area: float = CROP_AREA_RANGE[0]
    random_flip: bool = True
    augmentation: AugmentConfig | None = None
    clip_resized: bool = True
    label_offset: int = 0
    num_classes: int = 1000
    synsets: tuple[str, ...] | None = None
    threads: int = 0

    @classmethod
    def of(cls, config: TrainerConfig, synsets=None, skip_records: int = 0) -> TrainInputs:
        """The training inputs of a run's config (``synsets``: the shards' classes, ``shard_classes``)."""
        data = config.data
        return cls(
            global_batch_size=data.global_batch_size,
            image_size=config.plan.input_size,
            seed=config.loop.seed,
            deterministic=config.loop.deterministic,
            skip_records=skip_records,
            min_crop_area=data.min_crop_area,
            random_flip=data.random_flip,
            augmentation=config.augment,
            clip_resized=data.clip_resized,
            label_offset=data.label_offset,
            num_classes=config.model.num_classes,
            synsets=None if synsets is None else tuple(synsets),
            threads=config.loop.cpu_threads,
        )


@dataclasses.dataclass(frozen=True)
class EvalInputs:
    """How an evaluation pass is read and prepared.

    Attributes:
      global_batch_size: evaluation examples per step over all replicas.
      image_size: the model resolution S.
      with_filenames: add ``"filenames"`` (string [batch]; empty for padding), for checking coverage.
      cycle_length: files read in parallel.
      crop_padding: see ``center_crop_window``.
      clip_resized: see ``resize``.
      label_offset, num_classes, synsets: see ``LabelChecker``.
      threads: as ``TrainInputs.threads``.
    """

    global_batch_size: int
    image_size: int
    with_filenames: bool = False
    cycle_length: int = 8
    crop_padding: int | None = None
    clip_resized: bool = True
    label_offset: int = 0
    num_classes: int = 1000
    synsets: tuple[str, ...] | None = None
    threads: int = 0

    @classmethod
    def of(cls, config: TrainerConfig, synsets=None) -> EvalInputs:
        """The evaluation inputs of a run's config (``synsets``: the shards' classes)."""
        plan = config.plan
        return cls(
            global_batch_size=plan.eval_global_batch_size,
            image_size=plan.input_size,
            crop_padding=plan.eval_crop_padding_pixels,
            clip_resized=config.data.clip_resized,
            label_offset=config.data.label_offset,
            num_classes=config.model.num_classes,
            synsets=None if synsets is None else tuple(synsets),
            threads=config.loop.cpu_threads,
        )


def _threading_options(threads: int) -> tf.data.Options:
    """tf.data options giving a pipeline a pool of ``threads`` threads and as much autotuning budget (0: the
    defaults, every core)."""
    options = tf.data.Options()
    if threads:
        options.threading.private_threadpool_size = threads
        options.autotune.cpu_budget = threads
    return options


def _records(files: tf.data.Dataset, cycle_length: int, deterministic: bool | None) -> tf.data.Dataset:
    """``(record, file name)`` of the files in ``files``, read ``cycle_length`` files at a time in parallel.

    The file name travels with each record so that a bad record can be reported with the shard it came from.
    """

    def read(path):
        records = tf.data.TFRecordDataset(path, buffer_size=TFRECORD_READ_BUFFER)
        return records.map(lambda record: (record, path))

    return files.interleave(
        read,
        cycle_length=cycle_length,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )


def _pipeline_seeds(seed: int | None, input_pipeline_id: int) -> tuple[int | None, int | None, int | None]:
    """Independent seeds (file shuffle, record shuffle, augmentation) for one host, or Nones if unseeded.

    Hosts must not share the augmentation stream, so the pipeline id enters the derivation.
    """
    if seed is None:
        return None, None, None
    state = np.random.SeedSequence([seed, input_pipeline_id]).generate_state(3)
    return tuple(int(s) for s in state)


def build_train_dataset(
    file_patterns: FilePatterns, input_context: tf.distribute.InputContext | None, inputs: TrainInputs
) -> tf.data.Dataset:
    """The endless training stream of this host: ``(images, labels)`` per-replica batches.

    Images are float32 [batch, S, S, 3] of pixel values in [0, 255] (the model standardises with the ImageNet
    mean and std itself); labels int32 [batch] in 0..K-1 (K classes: 1000 for ImageNet, the manifest's count
    for shards of ``beam_preprocess --classes found``).

    Files are sharded by input pipeline, shuffled every epoch and read ``cycle_length`` at a time; records
    pass a ``shuffle_buffer_size`` buffer and are batched with ``drop_remainder=True``; each batch is parsed
    at once, and its images decoded, randomly cropped, resized, flipped and augmented one by one inside that
    batch's step of a parallel map, then prefetched. Preparing whole batches rather than single records saves
    tf.data's per-element work (a function call and a buffer hand-off per stage), which dominates on small
    images (docs/performance.md, "input batches prepared whole"); every image and label is the same as one
    record at a time gives.

    Args:
      file_patterns: glob(s) of the training shards.
      input_context: the ``tf.distribute.InputContext`` of ``distribute_datasets_from_function``; None is
        one pipeline feeding one replica.
      inputs: how the stream is read and prepared (``TrainInputs``; ``TrainInputs.of(config)`` for a run).
    """
    ctx = _context(input_context)
    per_replica = ctx.get_per_replica_batch_size(inputs.global_batch_size)
    if inputs.shuffle_buffer_size < 1 or inputs.cycle_length < 1:
        raise ValueError(
            f"shuffle_buffer_size={inputs.shuffle_buffer_size} and cycle_length={inputs.cycle_length} "
            "must be positive"
        )
    files = pipeline_files(list_files(file_patterns), ctx.num_input_pipelines, ctx.input_pipeline_id)
    file_seed, shuffle_seed, augment_seed = _pipeline_seeds(inputs.seed, ctx.input_pipeline_id)
    ordered = inputs.deterministic or inputs.seed is not None

    dataset = tf.data.Dataset.from_tensor_slices(files)
    dataset = dataset.shuffle(len(files), seed=file_seed, reshuffle_each_iteration=True).repeat()
    dataset = _records(dataset, min(inputs.cycle_length, len(files)), ordered)
    dataset = dataset.shuffle(inputs.shuffle_buffer_size, seed=shuffle_seed, reshuffle_each_iteration=True)
    # Six stateless seed values per record (its [3, 2] seeds), attached before the parallel map so that map
    # order is irrelevant.
    augment_seeds = tf.data.Dataset.random(seed=augment_seed).batch(6)
    dataset = tf.data.Dataset.zip(dataset, augment_seeds)
    if inputs.skip_records:
        dataset = dataset.skip(inputs.skip_records)

    check_label = LabelChecker(inputs.label_offset, inputs.num_classes, inputs.synsets)
    image_spec = tf.TensorSpec([inputs.image_size, inputs.image_size, 3], tf.float32)

    def preprocess_one(record):
        image_bytes, stored, synset, path, seeds = record
        image = preprocess_for_train(
            image_bytes,
            inputs.image_size,
            tf.reshape(seeds, [3, 2]),
            inputs.fused_decode_crop,
            inputs.min_crop_area,
            inputs.random_flip,
            inputs.augmentation,
            inputs.clip_resized,
        )
        return image, check_label(stored, synset, path)

    def preprocess_batch(records_and_paths, seeds):
        records, paths = records_and_paths
        examples = parse_examples(records)
        batch = (
            examples[schema.IMAGE_ENCODED],
            examples[schema.LABEL],
            examples[schema.SYNSET],
            paths,
            seeds,
        )
        return tf.map_fn(preprocess_one, batch, fn_output_signature=(image_spec, tf.int32))

    dataset = dataset.batch(per_replica, drop_remainder=True)
    dataset = dataset.map(preprocess_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=ordered)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    options = _threading_options(inputs.threads)
    options.deterministic = ordered
    return dataset.with_options(options)


def build_eval_dataset(
    file_patterns: FilePatterns,
    input_context: tf.distribute.InputContext | None,
    inputs: EvalInputs,
    plan: EvalPlan | None = None,
) -> tf.data.Dataset:
    """One evaluation pass of this host: exactly ``eval_plan(...).steps x replicas_per_pipeline`` per-replica
    batches of dicts ``{"images", "labels", "mask"}`` (plus ``"filenames"`` with ``with_filenames``).

    The host's records in a fixed order, then padding (label -1, mask 0, black image) up to
    ``eval_plan(...).examples_per_pipeline``, so every replica of every host runs the same number of steps.
    ``mask`` is float32 [batch], 1 for a real image. Mask the padding out of every metric and out of the loss:
    label -1 is not a valid class index (sparse cross-entropy raises or returns NaN on it, and NaN * 0 is
    still NaN), so clamp labels before the loss. Iterate it once per evaluation (it does not repeat).

    Args:
      file_patterns: glob(s) of the validation shards.
      input_context: as for ``build_train_dataset``.
      inputs: how the pass is read and prepared (``EvalInputs``; ``EvalInputs.of(config)`` for a run).
      plan: ``eval_plan`` of the same arguments when the caller has it already (it counts every shard).
    """
    ctx = _context(input_context)
    check_label = LabelChecker(inputs.label_offset, inputs.num_classes, inputs.synsets)
    plan = plan or eval_plan(file_patterns, inputs.global_batch_size, ctx)
    files = pipeline_files(list_files(file_patterns), ctx.num_input_pipelines, ctx.input_pipeline_id)

    batch = plan.per_replica_batch_size
    image_spec = tf.TensorSpec([inputs.image_size, inputs.image_size, 3], tf.float32)

    def preprocess_one(record):
        image_bytes, stored, synset, path = record
        image = preprocess_for_eval(image_bytes, inputs.image_size, inputs.crop_padding, inputs.clip_resized)
        return image, check_label(stored, synset, path)

    def preprocess_batch(records, paths):
        """A batch of records (the last one of the pass may be short), padded up to ``batch``."""
        examples = tf.io.parse_example(records, _features(inputs.with_filenames))
        images, labels = tf.map_fn(
            preprocess_one,
            (examples[schema.IMAGE_ENCODED], examples[schema.LABEL], examples[schema.SYNSET], paths),
            fn_output_signature=(image_spec, tf.int32),
        )
        missing = batch - tf.shape(records)[0]
        element = {
            IMAGES: tf.pad(images, [[0, missing], [0, 0], [0, 0], [0, 0]]),
            LABELS: tf.pad(labels, [[0, missing]], constant_values=PADDING_LABEL),
            MASK: tf.pad(tf.ones_like(labels, tf.float32), [[0, missing]]),
        }
        if inputs.with_filenames:
            element[FILENAMES] = tf.pad(examples[schema.FILENAME], [[0, missing]], constant_values="")
        return {key: tf.ensure_shape(value, [batch, *value.shape[1:]]) for key, value in element.items()}

    padding = {
        IMAGES: tf.zeros([batch, inputs.image_size, inputs.image_size, 3], tf.float32),
        LABELS: tf.fill([batch], PADDING_LABEL),
        MASK: tf.zeros([batch], tf.float32),
    }
    if inputs.with_filenames:
        padding[FILENAMES] = tf.fill([batch], "")

    # The host's records in order, batched (each batch prepared at once, as in training), the last batch
    # padded; then whole batches of padding. take() on that endless tail fixes the length (and the
    # cardinality) at exactly one pass.
    dataset = _records(tf.data.Dataset.from_tensor_slices(files), min(inputs.cycle_length, len(files)), True)
    dataset = dataset.batch(batch).map(
        preprocess_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    dataset = dataset.concatenate(tf.data.Dataset.from_tensors(padding).repeat())
    dataset = dataset.take(plan.examples_per_pipeline // batch).prefetch(tf.data.AUTOTUNE)
    return dataset.with_options(_threading_options(inputs.threads))
