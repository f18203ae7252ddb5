"""Per-host tf.data input pipelines for training and in-loop evaluation (docs/recipe.md, "The data and the input pipeline").

Both builders are written to run inside ``strategy.distribute_datasets_from_function``::

    train = strategy.distribute_datasets_from_function(
        lambda ctx: build_train_dataset(files, ctx, global_batch_size, image_size, seed=seed))
    plan = eval_plan(val_files, eval_batch_size, tf.distribute.InputContext(num_pipelines, 0, replicas))
    evals = strategy.distribute_datasets_from_function(
        lambda ctx: build_eval_dataset(val_files, ctx, eval_batch_size, image_size))

Each input pipeline (one per host) lists the files in sorted order and keeps every ``num_input_pipelines``-th
file starting at its own id, so a host never reads another host's shards. Batches are per-replica batches
(``ctx.get_per_replica_batch_size``) with ``drop_remainder=True``.

Elements:
  training: ``(images, labels)``: images float32 [batch, S, S, 3] of pixel values in [0, 255] (the model
    standardises with the ImageNet mean and std itself), labels int32 [batch] in 0..K-1 (K classes: 1000 for
    ImageNet, the manifest's count for shards of ``beam_preprocess --classes found``).
  evaluation: a dict ``{"images", "labels", "mask"}`` (plus ``"filenames"`` with ``with_filenames=True``):
    mask float32 [batch] is 1 for a real image and 0 for padding; padding has label -1 and black pixels.
    Mask the padding out of every metric and out of the loss: label -1 is not a valid class index (sparse
    cross-entropy raises or returns NaN on it, and NaN * 0 is still NaN), so clamp labels before the loss.

Every input pipeline yields exactly ``eval_plan(...).steps`` evaluation steps, the same on every host, because
collectives need equal step counts everywhere; together the pipelines cover each validation record once.
Shards must be JPEG records of the ``beam_preprocess.schema`` contract (that stage re-encodes PNG and CMYK).
"""

from __future__ import annotations

import dataclasses
import math
import os
import posixpath
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from beam_preprocess import schema
from beam_preprocess.manifest import MANIFEST_NAME, Manifest
from trainer_module import augment, files

if TYPE_CHECKING:
    from trainer_module.config import AugmentConfig

# Element keys of evaluation batches.
IMAGES = "images"
LABELS = "labels"
MASK = "mask"
FILENAMES = "filenames"

PADDING_LABEL = -1

# Training crop (Inception-style, as in tensorflow/tpu efficientnet): sampled box constraints.
CROP_AREA_RANGE = (0.08, 1.0)
CROP_ASPECT_RATIO_RANGE = (3.0 / 4.0, 4.0 / 3.0)
CROP_MIN_OBJECT_COVERED = 0.1
CROP_MAX_ATTEMPTS = 10
# Evaluation keeps the central 87.5% of the shorter side (224 of 256 at 224 px).
EVAL_CROP_FRACTION = 0.875

TFRECORD_READ_BUFFER = 8 * 2**20  # bytes read ahead per open shard

FilePatterns = str | Sequence[str]

# The whole image as the one "object" box: sampled crops must cover 10% of it.
# A Python value, not a tf.constant: creating a tensor at import would initialise TensorFlow's runtime before
# MultiWorkerMirroredStrategy can configure collective ops.
_WHOLE_IMAGE_BOX = [[[0.0, 0.0, 1.0, 1.0]]]


# --------------------------------------------------------------------------------------------------
# Crop windows and per-image preprocessing. A window is int32 [offset_y, offset_x, height, width], the
# argument of tf.image.decode_and_crop_jpeg.


def eval_crop_padding(image_size: int) -> int:
    """Pixels added to ``image_size`` to size the evaluation crop: round(S * (1/0.875 - 1)), 32 at 224.

    Today's reference derives the padding from the 0.875 crop; the paper-era code used a constant 32 at every
    resolution (0.934 of the short side at 456), which ``data.eval_crop_padding=32`` reproduces.
    """
    return round(image_size * (1.0 / EVAL_CROP_FRACTION - 1.0))


def center_crop_window(image_shape: tf.Tensor, image_size: int, crop_padding: int | None = None) -> tf.Tensor:
    """The evaluation crop: a centred square of side S / (S + pad) * min(height, width), rounded down.

    Args:
      image_shape: int32 [height, width, ...] of the encoded image (``tf.image.extract_jpeg_shape``).
      image_size: the model resolution S.
      crop_padding: pad above; None takes ``eval_crop_padding(S)``.

    Returns:
      int32 [offset_y, offset_x, side, side]; odd margins put the extra pixel before the crop.
    """
    height, width = image_shape[0], image_shape[1]
    # Integer arithmetic: floor(S * min / (S + pad)) exactly, where float32 can land one pixel short.
    pad = eval_crop_padding(image_size) if crop_padding is None else crop_padding
    side = (image_size * tf.minimum(height, width)) // (image_size + pad)
    side = tf.maximum(side, 1)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def train_crop_window(
    image_shape: tf.Tensor, image_size: int, seed: tf.Tensor, min_area: float = CROP_AREA_RANGE[0]
) -> tf.Tensor:
    """A random training crop: area 8%-100%, aspect 3/4-4/3, or the evaluation crop when sampling fails.

    ``sample_distorted_bounding_box`` returns the whole image after ``max_attempts`` failed tries. The
    reference (tensorflow/tpu efficientnet ``_decode_and_random_crop``) treats a crop whose shape equals the
    image's as that failure and takes the centre crop instead; this does the same, comparing height and width
    only, so a grayscale JPEG (1 channel in its header, decoded to 3) is judged like any other.

    Args:
      image_shape: int32 [height, width, channels] of the encoded image.
      image_size: the model resolution S (sizes the fallback crop).
      seed: int32/int64 [2], the stateless seed of the sampler.

    Returns:
      int32 [offset_y, offset_x, height, width].
    """
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        image_shape,
        bounding_boxes=_WHOLE_IMAGE_BOX,
        seed=seed,
        min_object_covered=CROP_MIN_OBJECT_COVERED,
        aspect_ratio_range=CROP_ASPECT_RATIO_RANGE,
        area_range=(min_area, CROP_AREA_RANGE[1]),
        max_attempts=CROP_MAX_ATTEMPTS,
        use_image_if_no_bounding_boxes=True,
    )
    sampled = tf.stack([begin[0], begin[1], size[0], size[1]])
    sampling_failed = tf.reduce_all(tf.equal(size[:2], image_shape[:2]))
    return tf.where(sampling_failed, center_crop_window(image_shape, image_size), sampled)


def decode_crop(image_bytes: tf.Tensor, window: tf.Tensor, fused: bool = True) -> tf.Tensor:
    """Decodes the ``window`` of a JPEG to uint8 [height, width, 3] (grayscale JPEGs become 3 channels).

    Args:
      fused: decode only the window (``decode_and_crop_jpeg``, skipping the rows outside it); False decodes
        the whole image and then slices, the baseline the benchmark compares against.
    """
    if fused:
        return tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3)
    image = tf.io.decode_jpeg(image_bytes, channels=3)
    return tf.image.crop_to_bounding_box(image, window[0], window[1], window[2], window[3])


def resize(image: tf.Tensor, image_size: int, clip: bool = True) -> tf.Tensor:
    """Bicubic resize to float32 [S, S, 3], clipped to [0, 255] (bicubic overshoots at sharp edges) unless
    ``clip`` is off (the reference's resize, ``data.clip_resized=false``)."""
    resized = tf.image.resize(image, [image_size, image_size], method=tf.image.ResizeMethod.BICUBIC)
    if clip:
        resized = tf.clip_by_value(resized, 0.0, 255.0)
    return tf.ensure_shape(resized, [image_size, image_size, 3])


def preprocess_for_train(
    image_bytes: tf.Tensor,
    image_size: int,
    seeds: tf.Tensor,
    fused: bool = True,
    min_crop_area: float = CROP_AREA_RANGE[0],
    random_flip: bool = True,
    augmentation: AugmentConfig | None = None,
    clip: bool = True,
) -> tf.Tensor:
    """Random crop, bicubic resize, random left-right flip, then the augmentation policy, of one JPEG;
    float32 [S, S, 3] in [0, 255]. The order is the reference's: AutoAugment / RandAugment see the flipped crop.

    Args:
      seeds: int64 [3, 2]: row 0 seeds the crop sampler, row 1 the flip, row 2 the augmentation policy
        (stateless ops, so a seeded pipeline is reproducible whatever the parallelism of the map); [2, 2]
        when there is no policy.
      fused: see ``decode_crop``.
      min_crop_area: smallest crop as a fraction of the image (0.08 in the recipe; small images of whole
        objects, like the demo's digits, need gentler crops).
      random_flip: flip left-right with probability 1/2 (not for data whose classes are not mirror-invariant).
      augmentation: the ``augment`` section (policy 'autoaugment', 'randaugment' or 'none'); None is 'none'.
      clip: see ``resize``.
    """
    window = train_crop_window(tf.image.extract_jpeg_shape(image_bytes), image_size, seeds[0], min_crop_area)
    image = resize(decode_crop(image_bytes, window, fused), image_size, clip)
    if random_flip:
        image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    if augmentation is None or augmentation.policy == "none":
        return image
    return augment.distort(
        image, seeds[2], augmentation.policy, augmentation.num_layers, augmentation.magnitude
    )


def preprocess_for_eval(
    image_bytes: tf.Tensor, image_size: int, crop_padding: int | None = None, clip: bool = True
) -> tf.Tensor:
    """Centre crop (see ``center_crop_window``) and bicubic resize of one JPEG; float32 [S, S, 3] in [0, 255]
    (``clip``: see ``resize``)."""
    window = center_crop_window(tf.image.extract_jpeg_shape(image_bytes), image_size, crop_padding)
    return resize(decode_crop(image_bytes, window), image_size, clip)


LABEL_CHECK_MARK = "label check failed"


class LabelError(ValueError):
    """A shard holds a label that is not the class it should be (another converter's convention, a wrong
    ``data.label_offset``, or a label outside [0, num_classes))."""


class LabelChecker:
    """Turns a stored label into a class index and checks it, so an off-by-one never trains silently.

    The class is ``stored - label_offset`` (0 for beam_preprocess shards, 1 for tensorflow/tpu's
    ``imagenet_to_gcs.py``, whose labels are 1..1000). It must lie in [0, num_classes), and where the record
    carries a synset (``image/class/synset``, written by both converters) it must be that synset's position in
    the class list: the manifest's synsets (``manifest_classes``), or the sorted 1000 ImageNet synsets. With
    the wrong offset the very first record fails, naming its shard; so does a record of a synset that is not
    one of the classes. A failure surfaces as a tf.data error that ``raise_label_error`` turns into one
    ``LabelError`` line.

    Create it inside the dataset function (it holds a lookup table, which must live where the dataset does).
    """

    def __init__(self, label_offset: int = 0, num_classes: int = 1000, synsets: Sequence[str] | None = None):
        self.label_offset = label_offset
        self.num_classes = num_classes
        synsets = list(schema.synsets() if synsets is None else synsets)
        self._positions = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(synsets, tf.string), tf.range(len(synsets), dtype=tf.int32)
            ),
            default_value=-1,
        )

    def __call__(self, stored: tf.Tensor, synset: tf.Tensor, path: tf.Tensor) -> tf.Tensor:
        label = tf.cast(stored, tf.int32) - self.label_offset
        position = self._positions.lookup(synset)
        inside = tf.logical_and(label >= 0, label < self.num_classes)
        # A record without a synset is checked by its range alone.
        matches = tf.logical_or(tf.equal(synset, ""), tf.equal(position, label))
        check = tf.debugging.Assert(
            tf.logical_and(inside, matches),
            [
                LABEL_CHECK_MARK,
                "file:",
                path,
                "stored label:",
                stored,
                "synset:",
                synset,
                "position:",
                position,
            ],
        )
        with tf.control_dependencies([check]):
            return tf.identity(label)


def raise_label_error(error: tf.errors.OpError, label_offset: int, num_classes: int) -> None:
    """Re-raises a failed ``LabelChecker`` assertion as one readable ``LabelError``; returns otherwise."""
    message = getattr(error, "message", str(error))
    if LABEL_CHECK_MARK not in message:
        return

    def field(name):
        found = re.search(rf"{name}:\]?\s*\[?([^\]\s]*)", message)
        return found.group(1) if found else "?"

    path, stored, synset, position = field("file"), field("stored label"), field("synset"), field("position")
    if position not in ("?", "-1"):
        problem = f"synset {synset} is class {position}, but its stored label {stored} - data.label_offset"
        problem += f"={label_offset} is {int(stored) - label_offset}" if stored.lstrip("-").isdigit() else ""
    elif position == "-1" and synset not in ("", "?"):
        problem = (
            f"synset {synset} (stored label {stored}) is not one of the {num_classes} classes of the shards"
        )
    else:
        problem = f"stored label {stored} - data.label_offset={label_offset} is outside [0, {num_classes})"
    hint = ""
    if stored.lstrip("-").isdigit() and position.isdigit() and int(stored) - int(position) == 1:
        hint = " (shards of tensorflow/tpu's imagenet_to_gcs.py hold labels 1..1000: set data.label_offset=1)"
    raise LabelError(f"{path}: {problem}{hint}") from None


def parse_example(record: tf.Tensor, with_filename: bool = False) -> dict[str, tf.Tensor]:
    """The JPEG bytes, the int32 label (and the file name) of one serialised ``tf.train.Example``."""
    features = {
        schema.IMAGE_ENCODED: tf.io.FixedLenFeature([], tf.string),
        schema.LABEL: tf.io.FixedLenFeature([], tf.int64),
        schema.SYNSET: tf.io.FixedLenFeature([], tf.string, default_value=""),
    }
    if with_filename:
        features[schema.FILENAME] = tf.io.FixedLenFeature([], tf.string, default_value="")
    return tf.io.parse_single_example(record, features)


# --------------------------------------------------------------------------------------------------
# Files: listing, per-host sharding, record counts.


GLOB_CHARACTERS = re.compile(r"[*?\[]")


def list_files(file_patterns: FilePatterns) -> list[str]:
    """Every file matching ``file_patterns`` (one glob or a list, as TFX passes ``fn_args.train_files``),
    sorted and without duplicates, so every host computes the same list.

    A name without glob characters is taken as it is, without asking the filesystem: a list already expanded
    (1,024 training shards on ``gs://``) costs no further listing; a missing file fails when it is read.

    Raises:
      ValueError: a pattern matches no file.
    """
    patterns = [file_patterns] if isinstance(file_patterns, str) else list(file_patterns)
    if not patterns:
        raise ValueError("file_patterns is empty: give at least one glob of TFRecord shards")
    files = set()
    for pattern in patterns:
        if not GLOB_CHARACTERS.search(pattern):
            files.add(pattern)
            continue
        matched = tf.io.gfile.glob(pattern)
        if not matched:
            raise ValueError(f"file pattern {pattern!r} matches no file")
        files.update(matched)
    return sorted(files)


def _context(input_context: tf.distribute.InputContext | None) -> tf.distribute.InputContext:
    # None: a single pipeline feeding a single replica (tests, benchmarks, plain Keras).
    return input_context or tf.distribute.InputContext()


def replicas_per_pipeline(input_context: tf.distribute.InputContext) -> int:
    """Replicas fed by each input pipeline (num_replicas_in_sync / num_input_pipelines)."""
    replicas, pipelines = input_context.num_replicas_in_sync, input_context.num_input_pipelines
    if replicas % pipelines:
        raise ValueError(
            f"num_replicas_in_sync={replicas} is not a multiple of num_input_pipelines={pipelines}: "
            "every input pipeline must feed the same number of replicas"
        )
    return replicas // pipelines


def pipeline_files(files: Sequence[str], num_input_pipelines: int, input_pipeline_id: int) -> list[str]:
    """The files input pipeline ``input_pipeline_id`` reads: every ``num_input_pipelines``-th from its id.

    Same rule as ``Dataset.shard`` on the sorted file list, in plain Python so the evaluation plan can count
    every pipeline's records.

    Raises:
      ValueError: the pipeline would get no file (fewer files than input pipelines).
    """
    own = list(files[input_pipeline_id::num_input_pipelines])
    if not own:
        raise ValueError(
            f"input pipeline {input_pipeline_id} of {num_input_pipelines} gets no file: only {len(files)} "
            f"files for {num_input_pipelines} input pipelines; write at least as many shards as hosts "
            "(beam_preprocess --num-hosts)"
        )
    return own


def _normalised(path: str) -> str:
    return path if "://" in path else os.path.normpath(os.path.abspath(path))


def read_manifest(manifest_path: str) -> Manifest:
    """The beam_preprocess manifest at ``manifest_path``, read through ``tf.io.gfile`` (gs://, ram://, local)."""
    return Manifest.from_json(
        files.read_text(manifest_path), directory=posixpath.dirname(manifest_path), source=manifest_path
    )


def manifest_path_of(shard_path: str) -> str:
    """Where the manifest of a shard sits: in the parent of its split directory."""
    return posixpath.join(posixpath.dirname(posixpath.dirname(shard_path)), MANIFEST_NAME)


def _manifest_counts(manifest_path: str) -> dict[str, tuple[int, int]]:
    """Path -> (records, bytes) of every shard a beam_preprocess manifest lists."""
    manifest = read_manifest(manifest_path)
    if manifest.compression != "none":
        raise ValueError(
            f"{manifest_path}: compression {manifest.compression!r} is not read here (expected 'none')"
        )
    return {
        _normalised(shard.path): (shard.records, shard.bytes)
        for split in manifest.splits.values()
        for shard in split.shards
    }


def _count_records(path: str) -> int:
    return int(tf.data.TFRecordDataset(path).reduce(np.int64(0), lambda count, _: count + 1))


def record_counts(files: Sequence[str]) -> list[int]:
    """Records in each file: from ``manifest.json`` beside the split directory, else by reading the file.

    The manifest of a ``beam_preprocess`` run sits in the parent of the shards' directory. Its counts are
    used only for files it lists with their exact current size; counting a file reads it end to end, fine for
    small data, too slow for ImageNet on every host.

    Raises:
      ValueError: a manifest exists but does not list a file, or lists it with another size (shards
        replaced since the manifest was written).
    """
    manifests: dict[str, dict[str, tuple[int, int]] | None] = {}
    counts = []
    for path in files:
        manifest_path = manifest_path_of(path)
        if manifest_path not in manifests:
            exists = tf.io.gfile.exists(manifest_path)
            manifests[manifest_path] = _manifest_counts(manifest_path) if exists else None
        listed = manifests[manifest_path]
        if listed is None:
            counts.append(_count_records(path))
            continue
        entry = listed.get(_normalised(path))
        if entry is None:
            raise ValueError(
                f"{path} is not listed in {manifest_path}: the split directory holds other files"
            )
        records, size = entry
        actual = tf.io.gfile.stat(path).length
        if actual != size:
            raise ValueError(
                f"{path} has {actual} bytes but {manifest_path} lists {size}: the manifest is stale"
            )
        counts.append(records)
    return counts


def shard_classes(file_patterns: FilePatterns) -> tuple[str, ...] | None:
    """The classes of the shards in label order, from their manifests; None where no manifest sits beside them.

    A beam_preprocess manifest names its classes (``LabelConvention.class_synsets``: ImageNet's 1000, or the
    synsets of a run with ``--classes found``/a class file); the classifier's width and the label check follow
    it. Shards of several manifests must agree on them.

    Raises:
      ValueError: two manifests of the files list different classes (both named).
    """
    found: dict[str, tuple[str, ...]] = {}
    for path in list_files(file_patterns):
        manifest_path = manifest_path_of(path)
        if manifest_path in found or not tf.io.gfile.exists(manifest_path):
            continue
        found[manifest_path] = read_manifest(manifest_path).label_convention.class_synsets()
    if not found:
        return None
    (first, classes), *others = found.items()
    for other, other_classes in others:
        if other_classes != classes:
            raise ValueError(
                f"{other} lists {len(other_classes)} classes and {first} {len(classes)} (or the same in another "
                "order): the shards read together must share one label numbering"
            )
    return classes


def num_examples(file_patterns: FilePatterns) -> int:
    """Records in all the files: the manifest's counts where the shards have one (see ``record_counts``)."""
    return sum(record_counts(list_files(file_patterns)))


# --------------------------------------------------------------------------------------------------
# The evaluation plan: equal step counts on every input pipeline.


@dataclasses.dataclass(frozen=True)
class EvalPlan:
    """How one evaluation pass is laid out over the input pipelines.

    Attributes:
      steps: evaluation steps of one pass, the same on every replica of every host.
      num_examples: real validation examples in all (the sum of the masks over a pass).
      per_replica_batch_size: examples per replica per step, padding included.
      replicas_per_pipeline: replicas each input pipeline feeds.
      pipeline_examples: real examples read by each input pipeline, by pipeline id.
    """

    steps: int
    num_examples: int
    per_replica_batch_size: int
    replicas_per_pipeline: int
    pipeline_examples: tuple[int, ...]

    @property
    def per_pipeline_batch_size(self) -> int:
        return self.per_replica_batch_size * self.replicas_per_pipeline

    @property
    def examples_per_pipeline(self) -> int:
        """Examples (real and padding) each pipeline yields per pass."""
        return self.steps * self.per_pipeline_batch_size

    @property
    def num_padding(self) -> int:
        """Padding examples over all pipelines per pass."""
        return self.examples_per_pipeline * len(self.pipeline_examples) - self.num_examples


def eval_plan(
    file_patterns: FilePatterns,
    global_batch_size: int,
    input_context: tf.distribute.InputContext | None = None,
) -> EvalPlan:
    """The evaluation step count and example count for ``build_eval_dataset`` with the same arguments.

    steps = ceil(max over pipelines of that pipeline's records / per-pipeline batch), where per-pipeline
    batch = per-replica batch x replicas fed by a pipeline. Only ``num_input_pipelines`` and
    ``num_replicas_in_sync`` of the context matter, so the training loop can build one itself.

    Args:
      file_patterns: glob(s) of the validation shards.
      global_batch_size: evaluation examples per step over all replicas.
      input_context: as passed to the dataset function; None is one pipeline feeding one replica.

    Raises:
      ValueError: batch not divisible by the replicas, replicas not a multiple of the input pipelines, fewer
        files than input pipelines, no records at all, or a stale manifest.
    """
    ctx = _context(input_context)
    per_replica = ctx.get_per_replica_batch_size(global_batch_size)
    replicas = replicas_per_pipeline(ctx)
    files = list_files(file_patterns)
    counts = dict(zip(files, record_counts(files), strict=True))
    pipeline_examples = tuple(
        sum(counts[f] for f in pipeline_files(files, ctx.num_input_pipelines, i))
        for i in range(ctx.num_input_pipelines)
    )
    if not sum(pipeline_examples):
        raise ValueError(f"the validation files {files} hold no records: nothing to evaluate")
    return EvalPlan(
        steps=math.ceil(max(pipeline_examples) / (per_replica * replicas)),
        num_examples=sum(pipeline_examples),
        per_replica_batch_size=per_replica,
        replicas_per_pipeline=replicas,
        pipeline_examples=pipeline_examples,
    )


# --------------------------------------------------------------------------------------------------
# The datasets.


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
    file_patterns: FilePatterns,
    input_context: tf.distribute.InputContext | None,
    global_batch_size: int,
    image_size: int,
    seed: int | None = None,
    deterministic: bool = False,
    shuffle_buffer_size: int = 2048,
    cycle_length: int = 16,
    fused_decode_crop: bool = True,
    skip_records: int = 0,
    min_crop_area: float = CROP_AREA_RANGE[0],
    random_flip: bool = True,
    augmentation: AugmentConfig | None = None,
    clip_resized: bool = True,
    label_offset: int = 0,
    num_classes: int = 1000,
    synsets: Sequence[str] | None = None,
) -> tf.data.Dataset:
    """The endless training stream of this host: ``(images, labels)`` per-replica batches.

    Files are sharded by input pipeline, shuffled every epoch and read ``cycle_length`` at a time; records
    pass a ``shuffle_buffer_size`` buffer, are decoded, randomly cropped, resized, flipped and augmented in
    parallel, then batched with ``drop_remainder=True`` and prefetched.

    Args:
      file_patterns: glob(s) of the training shards.
      input_context: the ``tf.distribute.InputContext`` of ``distribute_datasets_from_function``; None is
        one pipeline feeding one replica.
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
    """
    ctx = _context(input_context)
    per_replica = ctx.get_per_replica_batch_size(global_batch_size)
    if shuffle_buffer_size < 1 or cycle_length < 1:
        raise ValueError(
            f"shuffle_buffer_size={shuffle_buffer_size} and cycle_length={cycle_length} must be positive"
        )
    files = pipeline_files(list_files(file_patterns), ctx.num_input_pipelines, ctx.input_pipeline_id)
    file_seed, shuffle_seed, augment_seed = _pipeline_seeds(seed, ctx.input_pipeline_id)
    ordered = deterministic or seed is not None

    dataset = tf.data.Dataset.from_tensor_slices(files)
    dataset = dataset.shuffle(len(files), seed=file_seed, reshuffle_each_iteration=True).repeat()
    dataset = _records(dataset, min(cycle_length, len(files)), ordered)
    dataset = dataset.shuffle(shuffle_buffer_size, seed=shuffle_seed, reshuffle_each_iteration=True)
    # One [3, 2] stateless seed per record, attached before the parallel map so that map order is irrelevant.
    augment_seeds = tf.data.Dataset.random(seed=augment_seed).batch(6).map(lambda s: tf.reshape(s, [3, 2]))
    dataset = tf.data.Dataset.zip(dataset, augment_seeds)
    if skip_records:
        dataset = dataset.skip(skip_records)

    check_label = LabelChecker(label_offset, num_classes, synsets)

    def preprocess(record_and_path, seeds):
        record, path = record_and_path
        example = parse_example(record)
        image = preprocess_for_train(
            example[schema.IMAGE_ENCODED],
            image_size,
            seeds,
            fused_decode_crop,
            min_crop_area,
            random_flip,
            augmentation,
            clip_resized,
        )
        return image, check_label(example[schema.LABEL], example[schema.SYNSET], path)

    dataset = dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=ordered)
    dataset = dataset.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = ordered
    return dataset.with_options(options)


def build_eval_dataset(
    file_patterns: FilePatterns,
    input_context: tf.distribute.InputContext | None,
    global_batch_size: int,
    image_size: int,
    with_filenames: bool = False,
    cycle_length: int = 8,
    crop_padding: int | None = None,
    clip_resized: bool = True,
    label_offset: int = 0,
    num_classes: int = 1000,
    synsets: Sequence[str] | None = None,
    plan: EvalPlan | None = None,
) -> tf.data.Dataset:
    """One evaluation pass of this host: exactly ``eval_plan(...).steps x replicas_per_pipeline`` per-replica
    batches of dicts ``{"images", "labels", "mask"}``.

    The host's records in a fixed order, then padding (label -1, mask 0, black image) up to
    ``eval_plan(...).examples_per_pipeline``, so every replica of every host runs the same number of steps.
    Iterate it once per evaluation (it does not repeat).

    Args:
      file_patterns: glob(s) of the validation shards.
      input_context: as for ``build_train_dataset``.
      global_batch_size: evaluation examples per step over all replicas.
      image_size: the model resolution S.
      with_filenames: add ``"filenames"`` (string [batch]; empty for padding), for checking coverage.
      cycle_length: files read in parallel.
      crop_padding: see ``center_crop_window``.
      clip_resized: see ``resize``.
      label_offset, num_classes, synsets: see ``LabelChecker``.
      plan: ``eval_plan`` of the same arguments when the caller has it already (it counts every shard).
    """
    ctx = _context(input_context)
    check_label = LabelChecker(label_offset, num_classes, synsets)
    plan = plan or eval_plan(file_patterns, global_batch_size, ctx)
    files = pipeline_files(list_files(file_patterns), ctx.num_input_pipelines, ctx.input_pipeline_id)

    def preprocess(record, path):
        example = parse_example(record, with_filenames)
        element = {
            IMAGES: preprocess_for_eval(
                example[schema.IMAGE_ENCODED], image_size, crop_padding, clip_resized
            ),
            LABELS: check_label(example[schema.LABEL], example[schema.SYNSET], path),
            MASK: tf.constant(1.0, tf.float32),
        }
        if with_filenames:
            element[FILENAMES] = example[schema.FILENAME]
        return element

    padding = {
        IMAGES: tf.zeros([image_size, image_size, 3], tf.float32),
        LABELS: tf.constant(PADDING_LABEL, tf.int32),
        MASK: tf.constant(0.0, tf.float32),
    }
    if with_filenames:
        padding[FILENAMES] = tf.constant("")

    dataset = _records(tf.data.Dataset.from_tensor_slices(files), min(cycle_length, len(files)), True)
    dataset = dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    # take() on the endless padding tail fixes the length (and the cardinality) at exactly one pass.
    dataset = dataset.concatenate(tf.data.Dataset.from_tensors(padding).repeat())
    dataset = dataset.take(plan.examples_per_pipeline)
    return dataset.batch(plan.per_replica_batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
