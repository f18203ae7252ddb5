"""Pure functions: check that an image decodes, fix the quirks of ILSVRC2012, build the tf.train.Example.

Every image is decoded in full, so a truncated or corrupt file is caught here rather than in the middle of a
training run. Only images that are not already RGB JPEGs are re-encoded (the PNG named ``.JPEG``, the CMYK
JPEGs, grayscale JPEGs); every other image's bytes pass through untouched.
"""

from __future__ import annotations

import dataclasses
import io
import warnings

from PIL import Image

from beam_preprocess import schema

# Re-encoding quality for the few fixed images; tensorflow-datasets and the tensorflow/tpu converter use 100.
FIXED_JPEG_QUALITY = 100

# Real ILSVRC2012 images are at most about 12 megapixels; anything far larger is a decompression bomb.
MAX_PIXELS = 80_000_000

FIX_NONE = "none"
FIX_PNG = "png"
FIX_CMYK = "cmyk"
FIX_GRAYSCALE = "grayscale"
FIX_OTHER = "other_mode"
FIX_KINDS = (FIX_PNG, FIX_CMYK, FIX_GRAYSCALE, FIX_OTHER)


class BadImageError(ValueError):
    """The bytes are not a usable image; the message says why."""


@dataclasses.dataclass(frozen=True)
class CheckedImage:
    """An image that decoded in full, as RGB JPEG bytes ready to be written."""

    jpeg: bytes
    height: int
    width: int
    fix: str  # FIX_NONE when the original bytes pass through untouched


def check_and_fix(data: bytes) -> CheckedImage:
    """Decodes ``data`` in full and returns RGB JPEG bytes, re-encoding only when the input is not one.

    Raises:
      BadImageError: empty, not an image, truncated or corrupt, or absurdly large.
    """
    if not data:
        raise BadImageError("empty file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            image_format, mode = image.format, image.mode
            if image.width * image.height > MAX_PIXELS:
                raise BadImageError(f"{image.width}x{image.height} pixels is more than {MAX_PIXELS}")
            image.load()  # full decode: raises on truncated or corrupt data
    except BadImageError:
        raise
    except Image.UnidentifiedImageError:
        raise BadImageError("not an image (unrecognised format)") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning) as e:
        raise BadImageError(f"does not decode: {e}") from None
    except Exception as e:  # noqa: BLE001 - decoders raise assorted errors on hostile input
        raise BadImageError(f"does not decode: {type(e).__name__}: {e}") from None

    if image_format == "JPEG" and mode == "RGB":
        return CheckedImage(data, image.height, image.width, FIX_NONE)
    if image_format == "PNG":
        fix = FIX_PNG
    elif mode == "CMYK":
        fix = FIX_CMYK
    elif mode in ("L", "LA", "1", "I", "I;16", "F"):
        fix = FIX_GRAYSCALE
    else:
        fix = FIX_OTHER
    out = io.BytesIO()
    image.convert("RGB").save(out, format="JPEG", quality=FIXED_JPEG_QUALITY)
    return CheckedImage(out.getvalue(), image.height, image.width, fix)


def _bytes_feature(value: bytes):
    import tensorflow as tf

    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int64_feature(value: int):
    import tensorflow as tf

    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def build_example(image: CheckedImage, filename: str, synset: str) -> bytes:
    """The serialized tf.train.Example of the reference schema (keys in ``beam_preprocess.schema``)."""
    import tensorflow as tf

    label = schema.synset_to_label()[synset]
    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                schema.IMAGE_ENCODED: _bytes_feature(image.jpeg),
                schema.IMAGE_FORMAT: _bytes_feature(b"JPEG"),
                schema.LABEL: _int64_feature(label),
                schema.SYNSET: _bytes_feature(synset.encode()),
                schema.HEIGHT: _int64_feature(image.height),
                schema.WIDTH: _int64_feature(image.width),
                schema.CHANNELS: _int64_feature(3),
                schema.COLORSPACE: _bytes_feature(b"RGB"),
                schema.FILENAME: _bytes_feature(filename.encode()),
            }
        )
    )
    return example.SerializeToString(deterministic=True)
