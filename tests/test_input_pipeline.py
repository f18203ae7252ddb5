"""The per-host input pipeline on real shards written by beam_preprocess: crops against independent
arithmetic, reproducibility, and exact eval coverage under MirroredStrategy and with two input pipelines."""

import json
import os
import shutil
import threading
import weakref

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_preprocess import sample_data
from beam_preprocess.config import ShardingConfig
from beam_preprocess.run import run
from effnet_common import quick_exit, schema
from trainer_module.data import input_pipeline as ip
from trainer_module.data import release

IMAGE_SIZE = 32
TRAIN_SHARDS = 4
VAL_SHARDS = 3  # odd on purpose: two pipelines get 2 and 1 files, so unequal record counts


@pytest.fixture(scope="module")
def shards(clean_archives, tmp_path_factory):
    out = tmp_path_factory.mktemp("input_pipeline_shards")
    config = ShardingConfig(
        output_dir=str(out),
        train_archive=clean_archives.train_archive,
        val_archive=clean_archives.val_archive,
        train_shards=TRAIN_SHARDS,
        val_shards=VAL_SHARDS,
    )
    run(config)
    return out


def _train_files(shards):
    return str(shards / schema.TRAIN / f"{schema.TRAIN}-*")


def _val_files(shards):
    return str(shards / schema.VALIDATION / f"{schema.VALIDATION}-*")


def _jpeg(width, height, mode="RGB"):
    photo = sample_data.photo_samples(1)[0].image
    return sample_data.encode_jpeg(photo.resize((width, height), Image.BICUBIC).convert(mode))


# ---------------------------------------------------------------------------------------------- crops


@pytest.mark.parametrize("image_size,padding", [(224, 32), (240, 34), (32, 5), (456, 65), (600, 86)])
def test_eval_crop_padding_is_the_reference_fraction(image_size, padding):
    assert ip.eval_crop_padding(image_size) == padding


@pytest.mark.parametrize(
    "height,width,image_size",
    [(256, 256, 224), (375, 500, 224), (500, 333, 224), (24, 24, 32), (157, 211, 64), (31, 1000, 240)],
)
def test_center_crop_window_matches_python_arithmetic(height, width, image_size):
    pad = round(image_size * (1 / 0.875 - 1))
    side = int(image_size / (image_size + pad) * min(height, width))
    expected = [(height - side + 1) // 2, (width - side + 1) // 2, side, side]
    window = ip.center_crop_window(tf.constant([height, width, 3]), image_size)
    assert window.numpy().tolist() == expected


@pytest.mark.parametrize("width,height,image_size", [(211, 157, 64), (150, 203, 224)])
def test_eval_preprocessing_equals_full_decode_slice_and_resize(width, height, image_size):
    jpeg = _jpeg(width, height)
    pad = round(image_size * (1 / 0.875 - 1))
    side = int(image_size / (image_size + pad) * min(height, width))
    top, left = (height - side + 1) // 2, (width - side + 1) // 2
    full = tf.io.decode_jpeg(jpeg, channels=3).numpy()
    assert full.shape == (height, width, 3)
    crop = full[top : top + side, left : left + side]
    expected = np.clip(tf.image.resize(crop, [image_size, image_size], method="bicubic").numpy(), 0, 255)

    window = ip.center_crop_window(tf.image.extract_jpeg_shape(jpeg), image_size)
    assert window.numpy().tolist() == [top, left, side, side]
    unfused = ip.resize(ip.decode_crop(jpeg, window, fused=False), image_size).numpy()
    np.testing.assert_array_equal(unfused, expected)

    # The fused decode-and-crop yields the full decode's pixels inside the window, except that libjpeg's
    # chroma upsampling sees no right-hand neighbour in the window's last column: a few levels there.
    fused = ip.decode_crop(jpeg, window, fused=True).numpy()
    np.testing.assert_array_equal(fused[:, :-1], crop[:, :-1])
    assert np.abs(fused[:, -1].astype(int) - crop[:, -1]).max() <= 8
    got = ip.preprocess_for_eval(tf.constant(jpeg), image_size).numpy()
    assert got.shape == (image_size, image_size, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=4.0)
    assert np.abs(got - expected).mean() < 0.05


def test_train_crop_windows_are_random_and_within_the_sampling_constraints():
    height, width, image_size = 300, 400, 64
    shape = tf.constant([height, width, 3])
    center = ip.center_crop_window(shape, image_size).numpy().tolist()
    windows = [
        ip.train_crop_window(shape, image_size, tf.constant([7, s])).numpy().tolist() for s in range(60)
    ]
    sampled = [w for w in windows if w != center]
    assert len({tuple(w) for w in sampled}) >= 50  # random, not one fixed box
    for top, left, h, w in sampled:
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
        assert 0.08 - 0.01 <= h * w / (height * width) <= 1.0
        assert 3 / 4 - 0.02 <= w / h <= 4 / 3 + 0.02  # box sides are rounded to whole pixels
    # Same seed, same window: the sampler is stateless.
    again = ip.train_crop_window(shape, image_size, tf.constant([7, 3])).numpy().tolist()
    assert again == windows[3]


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_train_crop_falls_back_to_the_eval_crop_when_sampling_fails(mode):
    # No box of aspect 3/4..4/3 covers 8% of a 300x8 strip: every attempt fails and the sampler returns the
    # whole image, which must become the centre crop (for a grayscale JPEG too, 1 channel in its header).
    jpeg = _jpeg(300, 8, mode)
    shape = tf.image.extract_jpeg_shape(jpeg)
    assert shape.numpy().tolist() == [8, 300, 3 if mode == "RGB" else 1]
    center = ip.center_crop_window(shape, IMAGE_SIZE).numpy().tolist()
    for s in range(5):
        assert ip.train_crop_window(shape, IMAGE_SIZE, tf.constant([s, 1])).numpy().tolist() == center
    evaluated = ip.preprocess_for_eval(tf.constant(jpeg), IMAGE_SIZE).numpy()
    flips = set()
    for s in range(8):
        seeds = tf.constant([[s, 0], [s, 1]], tf.int64)
        trained = ip.preprocess_for_train(tf.constant(jpeg), IMAGE_SIZE, seeds).numpy()
        flipped = np.array_equal(trained, evaluated[:, ::-1])
        assert flipped or np.array_equal(trained, evaluated)
        flips.add(flipped)
    assert flips == {True, False}  # the random flip still applies after the fallback


# ---------------------------------------------------------------------------------------------- train


def test_train_batches_have_the_documented_shapes_dtypes_and_ranges(shards, clean_archives):
    dataset = ip.build_train_dataset(_train_files(shards), None, ip.TrainInputs(16, IMAGE_SIZE))
    assert dataset.element_spec == (
        tf.TensorSpec([16, IMAGE_SIZE, IMAGE_SIZE, 3], tf.float32),
        tf.TensorSpec([16], tf.int32),
    )
    expected_labels = {schema.synset_to_label()[s] for s in clean_archives.train.values()}
    for images, labels in dataset.take(3):
        images = images.numpy()
        assert images.min() >= 0.0 and images.max() <= 255.0 and images.max() > 100.0
        assert set(labels.numpy().tolist()) <= expected_labels


def test_seeded_train_dataset_is_reproducible_and_the_seed_matters(shards):
    def first_batches(seed):
        dataset = ip.build_train_dataset(_train_files(shards), None, ip.TrainInputs(8, IMAGE_SIZE, seed=seed))
        assert dataset.options().deterministic
        return [(x.numpy(), y.numpy()) for x, y in dataset.take(2)]

    first, again, other = first_batches(5), first_batches(5), first_batches(6)
    for (x1, y1), (x2, y2) in zip(first, again, strict=True):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(first[0][0], other[0][0])
    unseeded = ip.build_train_dataset(_train_files(shards), None, ip.TrainInputs(8, IMAGE_SIZE))
    assert not unseeded.options().deterministic  # speed by default


def _record_at_a_time(files, inputs):
    """The training stream as it was built before batches were prepared whole: each record parsed, cropped,
    resized and flipped on its own with its own [3, 2] seeds, then batched (the reference of the next test)."""
    file_seed, shuffle_seed, augment_seed = ip._pipeline_seeds(inputs.seed, 0)
    records = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=file_seed).repeat()
    records = ip._records(records, min(inputs.cycle_length, len(files)), True)
    records = records.shuffle(inputs.shuffle_buffer_size, seed=shuffle_seed)
    seeds = tf.data.Dataset.random(seed=augment_seed).batch(6).map(lambda s: tf.reshape(s, [3, 2]))
    check_label = ip.LabelChecker(num_classes=inputs.num_classes)

    def one(record_and_path, seeds):
        record, path = record_and_path
        example = ip.parse_example(record)
        image = ip.preprocess_for_train(
            example[schema.IMAGE_ENCODED], inputs.image_size, seeds, min_crop_area=inputs.min_crop_area
        )
        return image, check_label(example[schema.LABEL], example[schema.SYNSET], path)

    stream = tf.data.Dataset.zip(records, seeds).skip(inputs.skip_records).map(one)
    return stream.batch(inputs.global_batch_size, drop_remainder=True)


def test_batches_prepared_whole_hold_the_images_and_labels_of_one_record_at_a_time(shards):
    files = ip.list_files(_train_files(shards))
    inputs = ip.TrainInputs(8, IMAGE_SIZE, seed=4, skip_records=13, min_crop_area=0.3)
    ours = ip.build_train_dataset(files, None, inputs)
    for (images, labels), (expected_images, expected_labels) in zip(
        ours.take(3), _record_at_a_time(files, inputs).take(3), strict=True
    ):
        np.testing.assert_array_equal(images.numpy(), expected_images.numpy())
        np.testing.assert_array_equal(labels.numpy(), expected_labels.numpy())


def test_input_pipelines_get_the_threads_of_the_setting(shards):
    for threads in (0, 1):
        train = ip.build_train_dataset(
            _train_files(shards), None, ip.TrainInputs(8, IMAGE_SIZE, threads=threads)
        )
        evaluation = ip.build_eval_dataset(
            _val_files(shards), None, ip.EvalInputs(8, IMAGE_SIZE, threads=threads)
        )
        for dataset in (train, evaluation):
            options = dataset.options()
            assert options.threading.private_threadpool_size == (threads or None)
            assert options.autotune.cpu_budget == (threads or None)
    assert ip.TrainInputs.of(_config_with_threads(3)).threads == 3
    assert ip.EvalInputs.of(_config_with_threads(3)).threads == 3


def _config_with_threads(threads):
    from trainer_module.config import replace
    from trainer_module.presets import get_preset

    return replace(get_preset("demo"), {"loop.cpu_threads": threads})


def test_train_per_replica_batch_and_hosts_get_disjoint_files(shards):
    files = ip.list_files(_train_files(shards))
    assert len(files) == TRAIN_SHARDS
    host_files = [ip.pipeline_files(files, 2, i) for i in range(2)]
    assert set(host_files[0]).isdisjoint(host_files[1]) and sorted(sum(host_files, [])) == files
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
    dataset = ip.build_train_dataset(_train_files(shards), ctx, ip.TrainInputs(32, IMAGE_SIZE))
    assert dataset.element_spec[0].shape == [8, IMAGE_SIZE, IMAGE_SIZE, 3]
    with pytest.raises(ValueError, match="global_batch_size` 30 is not divisible"):
        ip.build_train_dataset(_train_files(shards), ctx, ip.TrainInputs(30, IMAGE_SIZE))


# ---------------------------------------------------------------------------------------------- eval


def _local(strategy, value):
    return [t.numpy() for t in strategy.experimental_local_results(value)]


def test_eval_under_mirrored_strategy_counts_every_validation_image_exactly_once(
    shards, clean_archives, logical_cpus
):
    strategy = tf.distribute.MirroredStrategy(logical_cpus[:4])
    global_batch = 12  # 100 images -> 9 steps of 12, 8 padding examples
    plan = ip.eval_plan(_val_files(shards), global_batch, tf.distribute.InputContext(1, 0, 4))
    assert (plan.steps, plan.num_examples, plan.num_padding) == (9, 100, 8)
    distributed = strategy.distribute_datasets_from_function(
        lambda ctx: ip.build_eval_dataset(
            _val_files(shards), ctx, ip.EvalInputs(global_batch, IMAGE_SIZE, with_filenames=True)
        )
    )
    steps, mask_total, seen = 0, 0.0, []
    for batch in distributed:
        steps += 1
        masks, labels, names = (_local(strategy, batch[k]) for k in (ip.MASK, ip.LABELS, ip.FILENAMES))
        images = _local(strategy, batch[ip.IMAGES])
        assert len(masks) == 4 and all(m.shape == (3,) for m in masks)
        for mask, label, name, image in zip(masks, labels, names, images, strict=True):
            assert image.shape == (3, IMAGE_SIZE, IMAGE_SIZE, 3) and image.dtype == np.float32
            mask_total += float(mask.sum())
            seen += [(n.decode(), int(lab)) for m, lab, n in zip(mask, label, name, strict=True) if m == 1.0]
            assert all(lab == -1 and n == b"" for m, lab, n in zip(mask, label, name, strict=True) if m == 0)
            assert not image[mask == 0].any()
    assert steps == plan.steps
    assert mask_total == len(clean_archives.validation) == plan.num_examples
    expected = {name: schema.synset_to_label()[synset] for name, synset in clean_archives.validation.items()}
    assert len(seen) == len(expected) and dict(seen) == expected


def test_two_input_pipelines_read_disjoint_files_cover_all_and_yield_equal_batches(shards, clean_archives):
    global_batch, replicas = 8, 4
    plan = ip.eval_plan(_val_files(shards), global_batch, tf.distribute.InputContext(2, 0, replicas))
    assert plan.pipeline_examples == (67, 33) and plan.steps == 17  # ceil(67 / (2 per replica x 2 replicas))
    names_by_pipeline, batches = [], []
    for pipeline_id in range(2):
        ctx = tf.distribute.InputContext(2, pipeline_id, replicas)
        dataset = ip.build_eval_dataset(
            _val_files(shards), ctx, ip.EvalInputs(global_batch, IMAGE_SIZE, with_filenames=True)
        )
        assert int(dataset.cardinality()) == plan.steps * plan.replicas_per_pipeline
        elements = list(dataset.as_numpy_iterator())
        batches.append(len(elements))
        names = [n.decode() for e in elements for n, m in zip(e[ip.FILENAMES], e[ip.MASK], strict=True) if m]
        assert len(names) == len(set(names)) == plan.pipeline_examples[pipeline_id]
        names_by_pipeline.append(set(names))
    assert batches[0] == batches[1] == plan.steps * 2
    assert names_by_pipeline[0].isdisjoint(names_by_pipeline[1])
    assert names_by_pipeline[0] | names_by_pipeline[1] == set(clean_archives.validation)
    # Files, not records, are split: each pipeline's names come from its own shards only.
    files = ip.list_files(_val_files(shards))
    for pipeline_id, names in enumerate(names_by_pipeline):
        own = ip.pipeline_files(files, 2, pipeline_id)
        in_own = {_filename(r) for path in own for r in tf.data.TFRecordDataset(path)}
        assert names == in_own


def _filename(record):
    example = tf.train.Example.FromString(record.numpy())
    return example.features.feature[schema.FILENAME].bytes_list.value[0].decode()


def test_eval_dataset_is_deterministic(shards):
    def first(dataset):
        return next(iter(dataset))[ip.IMAGES].numpy()

    np.testing.assert_array_equal(
        first(ip.build_eval_dataset(_val_files(shards), None, ip.EvalInputs(4, IMAGE_SIZE))),
        first(ip.build_eval_dataset(_val_files(shards), None, ip.EvalInputs(4, IMAGE_SIZE))),
    )


def test_too_few_files_for_the_input_pipelines_is_named(shards):
    ctx = tf.distribute.InputContext(num_input_pipelines=4, input_pipeline_id=3, num_replicas_in_sync=4)
    with pytest.raises(ValueError, match="input pipeline 3 of 4 gets no file: only 3 files"):
        ip.build_eval_dataset(_val_files(shards), ctx, ip.EvalInputs(8, IMAGE_SIZE))
    with pytest.raises(ValueError, match="num_replicas_in_sync=6 is not a multiple of num_input_pipelines=4"):
        ip.eval_plan(_val_files(shards), 12, tf.distribute.InputContext(4, 0, 6))


# ---------------------------------------------------------------------------------------------- files


def test_file_patterns_are_globbed_sorted_and_deduplicated(shards):
    files = ip.list_files([_val_files(shards), str(shards / schema.VALIDATION / "*-00000-of-*")])
    assert files == sorted(files) and len(files) == VAL_SHARDS
    with pytest.raises(ValueError, match="matches no file"):
        ip.list_files([_val_files(shards), str(shards / "nothing-*")])


def test_record_counts_from_the_manifest_equal_counting_and_a_stale_manifest_is_refused(shards, tmp_path):
    files = ip.list_files(_val_files(shards))
    with open(shards / "manifest.json") as f:
        listed = [s["records"] for s in json.load(f)["splits"][schema.VALIDATION]["shards"]]
    assert ip.record_counts(files) == listed and sum(listed) == 100

    # Without a manifest the records are counted.
    copy = tmp_path / "no_manifest" / schema.VALIDATION
    shutil.copytree(shards / schema.VALIDATION, copy)
    assert ip.record_counts(ip.list_files(str(copy / "*"))) == listed

    # A manifest whose sizes no longer match the files is refused, naming the file.
    stale_root = tmp_path / "stale"
    shutil.copytree(shards / schema.VALIDATION, stale_root / schema.VALIDATION)
    shutil.copy(shards / "manifest.json", stale_root / "manifest.json")
    victim = ip.list_files(str(stale_root / schema.VALIDATION / "*"))[1]
    with open(victim, "ab") as f:
        f.write(b"x")
    with pytest.raises(
        ValueError, match=f"{os.path.basename(victim)} has .* bytes but .* the manifest is stale"
    ):
        ip.record_counts(ip.list_files(str(stale_root / schema.VALIDATION / "*")))


# ---------------------------------------------------------------------------------------------- labels


@pytest.fixture(scope="module")
def one_based_shards(shards, tmp_path_factory):
    """The validation shards rewritten with labels 1..1000, as tensorflow/tpu's imagenet_to_gcs.py writes them."""
    out = tmp_path_factory.mktemp("one_based") / schema.VALIDATION
    out.mkdir()
    for path in ip.list_files(_val_files(shards)):
        with tf.io.TFRecordWriter(str(out / os.path.basename(path))) as writer:
            for record in tf.data.TFRecordDataset(path):
                example = tf.train.Example.FromString(record.numpy())
                label = example.features.feature[schema.LABEL].int64_list.value
                label[0] += 1
                writer.write(example.SerializeToString())
    return str(out / "*")


def _eval_labels(files, **kwargs):
    dataset = ip.build_eval_dataset(files, None, ip.EvalInputs(8, IMAGE_SIZE, **kwargs))
    return [int(x) for batch in dataset for x, m in zip(batch[ip.LABELS], batch[ip.MASK], strict=False) if m]


def test_label_offset_reads_one_based_shards_as_the_same_classes(shards, one_based_shards):
    assert _eval_labels(one_based_shards, label_offset=1) == _eval_labels(_val_files(shards))


def test_a_wrong_label_offset_stops_at_the_first_record_naming_its_shard(one_based_shards):
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        _eval_labels(one_based_shards)
    with pytest.raises(ip.LabelError) as error:
        ip.raise_label_error(caught.value, label_offset=0, num_classes=1000)
    message = str(error.value)
    assert "validation-00000-of-00003" in message and "set data.label_offset=1" in message
    assert "\n" not in message
    # Training reads through the same check.
    train = ip.build_train_dataset(one_based_shards, None, ip.TrainInputs(4, IMAGE_SIZE, seed=1))
    with pytest.raises(tf.errors.InvalidArgumentError, match=ip.LABEL_CHECK_MARK):
        next(iter(train))


def test_a_label_outside_the_classes_is_refused_even_without_a_synset(shards, tmp_path):
    path = tmp_path / "validation-00000-of-00001"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in tf.data.TFRecordDataset(ip.list_files(_val_files(shards))[0]).take(3):
            example = tf.train.Example.FromString(record.numpy())
            example.features.feature[schema.SYNSET].bytes_list.value[0] = b""
            example.features.feature[schema.LABEL].int64_list.value[0] = 1000
            writer.write(example.SerializeToString())
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        _eval_labels(str(path))
    with pytest.raises(
        ip.LabelError, match=r"stored label 1000 - data.label_offset=0 is outside \[0, 1000\)"
    ):
        ip.raise_label_error(caught.value, label_offset=0, num_classes=1000)


def test_paper_era_eval_crop_keeps_more_of_the_image():
    shape = tf.constant([456, 608, 3])
    today = ip.center_crop_window(shape, 456).numpy().tolist()
    paper = ip.center_crop_window(shape, 456, crop_padding=32).numpy().tolist()
    assert today[2] == 456 * 456 // (456 + 65) == 399  # 0.875 of the short side
    assert paper[2] == 456 * 456 // (456 + 32) == 426  # 0.934 of the short side
    assert paper[:2] == [(456 - 426 + 1) // 2, (608 - 426 + 1) // 2]


def test_a_released_iterator_is_deleted_on_the_release_thread_not_the_callers(monkeypatch):
    tracked = []  # what the process's end waits for or leaves without finalizing (effnet_common.quick_exit)
    monkeypatch.setattr(quick_exit, "track", tracked.append)
    autotuned = tf.data.Dataset.range(10**6).map(lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE)
    stream = [iter(autotuned.batch(8).prefetch(tf.data.AUTOTUNE))]
    assert int(next(stream[0])[0]) == 1
    deleted_on = []
    watch = weakref.ref(stream[0], lambda _: deleted_on.append(threading.current_thread().name))
    thread = release.release_in_background(stream)
    thread.join(timeout=120)  # TensorFlow's wait for the pipeline's model thread: up to a minute
    assert not thread.is_alive() and thread.daemon
    assert stream == [] and watch() is None
    assert deleted_on == [release.THREAD_NAME]
    assert tracked == [thread]
