"""The pure functions of beam_preprocess: decode checks, quirk fixes, the Example schema, the label list."""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_preprocess import images
from effnet_common import schema


def _photo(mode="RGB", size=(40, 30)):
    """A smooth colour image (JPEG-friendly, so conversions can be compared closely)."""
    y, x = np.mgrid[0 : size[1], 0 : size[0]]
    rgb = np.stack([x * 255 // size[0], y * 255 // size[1], (x + y) * 255 // sum(size)], axis=-1)
    return Image.fromarray(rgb.astype(np.uint8), "RGB").convert(mode)


def _encode(image, fmt="JPEG"):
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def test_rgb_jpeg_bytes_pass_through_untouched():
    data = _encode(_photo())
    checked = images.check_and_fix(data)
    assert checked.jpeg is data
    assert (checked.height, checked.width, checked.fix) == (30, 40, images.FIX_NONE)


@pytest.mark.parametrize(
    "mode,fmt,fix",
    [("RGB", "PNG", images.FIX_PNG), ("CMYK", "JPEG", images.FIX_CMYK), ("L", "JPEG", images.FIX_GRAYSCALE)],
)
def test_quirks_become_rgb_jpeg(mode, fmt, fix):
    data = _encode(_photo(mode), fmt)
    checked = images.check_and_fix(data)
    assert checked.fix == fix
    decoded = Image.open(io.BytesIO(checked.jpeg))
    assert (decoded.format, decoded.mode, decoded.size) == ("JPEG", "RGB", (40, 30))
    # The conversion keeps the picture: compare with PIL's own RGB rendering of the stored bytes.
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32)
    assert np.abs(np.asarray(decoded, dtype=np.float32) - expected).mean() < 2


@pytest.mark.parametrize(
    "data,reason",
    [
        (b"", "empty file"),
        (b"plain text, not an image", "not an image"),
        (_encode(_photo())[:300], "does not decode"),
        (_encode(_photo(), "PNG")[:-40], "does not decode"),
    ],
    ids=["empty", "text", "truncated-jpeg", "truncated-png"],
)
def test_bad_bytes_are_refused_with_a_reason(data, reason):
    with pytest.raises(images.BadImageError, match=reason):
        images.check_and_fix(data)


def test_example_has_the_reference_schema_and_label_convention():
    checked = images.check_and_fix(_encode(_photo()))
    synset = "n01440764"
    record = images.build_example(checked, "n01440764_10026.JPEG", synset)
    spec = {
        schema.IMAGE_ENCODED: tf.io.FixedLenFeature([], tf.string),
        schema.IMAGE_FORMAT: tf.io.FixedLenFeature([], tf.string),
        schema.LABEL: tf.io.FixedLenFeature([], tf.int64),
        schema.SYNSET: tf.io.FixedLenFeature([], tf.string),
        schema.HEIGHT: tf.io.FixedLenFeature([], tf.int64),
        schema.WIDTH: tf.io.FixedLenFeature([], tf.int64),
        schema.CHANNELS: tf.io.FixedLenFeature([], tf.int64),
        schema.COLORSPACE: tf.io.FixedLenFeature([], tf.string),
        schema.FILENAME: tf.io.FixedLenFeature([], tf.string),
    }
    assert set(spec) == set(schema.FEATURE_KEYS)
    parsed = tf.io.parse_single_example(record, spec)
    assert parsed[schema.IMAGE_ENCODED].numpy() == checked.jpeg
    assert parsed[schema.LABEL].numpy() == 0  # n01440764 is the first synset
    assert parsed[schema.SYNSET].numpy() == synset.encode()
    assert (parsed[schema.HEIGHT].numpy(), parsed[schema.WIDTH].numpy(), parsed[schema.CHANNELS].numpy()) == (
        30,
        40,
        3,
    )
    assert parsed[schema.IMAGE_FORMAT].numpy() == b"JPEG"
    assert parsed[schema.COLORSPACE].numpy() == b"RGB"
    assert parsed[schema.FILENAME].numpy() == b"n01440764_10026.JPEG"
    # Serialization is deterministic: the same inputs give the same bytes.
    assert images.build_example(checked, "n01440764_10026.JPEG", synset) == record


def test_synset_list_and_validation_labels_are_the_shipped_ones():
    synsets = schema.synsets()
    assert len(synsets) == 1000 and list(synsets) == sorted(synsets)
    assert synsets[0] == "n01440764" and synsets[-1] == "n15075141"
    assert schema.synset_to_label()["n15075141"] == 999
    # ILSVRC2012_val_00000001.JPEG is a snake (n01751748) in the official list.
    assert schema.validation_synset_for("ILSVRC2012_val_00000001.JPEG") == "n01751748"
    assert schema.validation_synset_for("ILSVRC2012_val_00050001.JPEG") is None
    assert schema.validation_synset_for("foo.JPEG") is None
    assert schema.shard_name("train", 3, 1024) == "train-00003-of-01024"


def _tensorflow_example(features: dict) -> bytes:
    """What TensorFlow serialises for one bytes or int value per feature (the reference for ours)."""
    return tf.train.Example(
        features=tf.train.Features(
            feature={
                key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
                if isinstance(value, bytes)
                else tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
                for key, value in features.items()
            }
        )
    ).SerializeToString(deterministic=True)


def test_plain_python_example_and_framing_are_byte_identical_to_tensorflow(tmp_path):
    from beam_preprocess import tfrecord

    features = {
        schema.IMAGE_ENCODED: b"\xff\xd8jpeg bytes",
        schema.LABEL: 999,
        schema.HEIGHT: 300,
        schema.WIDTH: 2**40,
        "negative": -5,
        schema.FILENAME: b"",
    }
    ours = tfrecord.encode_example(features)
    theirs = _tensorflow_example(features)
    assert ours == theirs

    records = [ours, b"", b"x" * 70_000]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    with open(path, "rb") as f:
        written_by_tf = f.read()
    assert b"".join(tfrecord.frame_record(r) for r in records) == written_by_tf
    # Decoding (what reads a tensorflow-datasets copy without TensorFlow) inverts what TensorFlow wrote.
    parsed = tf.train.Example.FromString(records[0]).features.feature
    decoded = tfrecord.decode_example(records[0])
    assert sorted(decoded) == sorted(parsed)
    for key, feature in parsed.items():
        kind = feature.WhichOneof("kind")
        assert decoded[key] == list(getattr(feature, kind).value), key
    with open(path, "rb") as f:
        assert list(tfrecord.read_records(f)) == records
    corrupt = bytearray(written_by_tf)
    corrupt[20] ^= 0xFF
    import io

    with pytest.raises(OSError, match="corrupt TFRecord"):
        list(tfrecord.read_records(io.BytesIO(bytes(corrupt))))


def test_example_pieces_join_to_tensorflows_example_and_leave_the_image_uncopied():
    from beam_preprocess import tfrecord

    image = bytes(range(256)) * 300  # long values: their own pieces
    features = {
        schema.IMAGE_ENCODED: image,
        schema.FILENAME: b"n" * 200,
        schema.LABEL: 7,
        schema.SYNSET: b"n01440764",  # short values: remembered entries
        schema.HEIGHT: 375,
    }
    expected = _tensorflow_example(features)
    for _ in range(2):  # the second time from the remembered short entries
        pieces = tfrecord.example_pieces(features)
        assert b"".join(pieces) == tfrecord.encode_example(features) == expected
        assert any(piece is image for piece in pieces)
