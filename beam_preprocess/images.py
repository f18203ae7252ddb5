"""Pure functions: check that an image decodes, fix the quirks of ILSVRC2012, build the tf.train.Example.

Every image is decoded, so a truncated or corrupt file is caught here rather than in the middle of a training
run. An RGB JPEG, whose bytes pass through untouched, is decoded at 1/8 scale: libjpeg still entropy-decodes
every coefficient of the whole stream (so truncation and broken Huffman data fail exactly as in a full decode)
but skips most of the inverse DCT and colour conversion (docs/performance.md, 'Sharding'). Images that are
not RGB JPEGs (the PNG named ``.JPEG``, the CMYK JPEGs, grayscale JPEGs) are decoded in full and re-encoded
as RGB JPEGs.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import warnings

from PIL import Image

from beam_preprocess import tfrecord
from effnet_common import schema

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
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise BadImageError(f"{width}x{height} pixels is more than {MAX_PIXELS}")
            passes_through = image_format == "JPEG" and mode == "RGB"
            if passes_through:
                image.draft(mode, (max(1, width // 8), max(1, height // 8)))
            image.load()  # raises on truncated or corrupt data
    except BadImageError:
        raise
    except Image.UnidentifiedImageError:
        raise BadImageError("not an image (unrecognised format)") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning) as e:
        raise BadImageError(f"does not decode: {e}") from None
    except Exception as e:  # noqa: BLE001 - decoders raise assorted errors on hostile input
        raise BadImageError(f"does not decode: {type(e).__name__}: {e}") from None

    if passes_through:
        return CheckedImage(data, height, width, FIX_NONE)
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
    return CheckedImage(out.getvalue(), height, width, fix)


def build_example(image: CheckedImage, filename: str, synset: str, label: int | None = None) -> bytes:
    """The serialized tf.train.Example of the reference schema (keys in ``effnet_common.schema``).

    ``label``: the stored label (``beam_preprocess.classes``); None is the synset's ImageNet label.
    """
    return b"".join(example_pieces(image, filename, synset, label))


def example_pieces(image: CheckedImage, filename: str, synset: str, label: int | None = None) -> list[bytes]:
    """``build_example`` as pieces to write one after the other, the image's bytes uncopied among them (a
    piece of its own)."""
    if label is None:
        label = schema.LABEL_OFFSET + schema.synset_to_label()[synset]
    after = tfrecord.short_entries(
        {
            schema.FILENAME: filename.encode(),
            schema.IMAGE_FORMAT: b"JPEG",
            schema.HEIGHT: image.height,
            schema.WIDTH: image.width,
        }
    )
    return tfrecord.spliced_example_pieces(
        _class_entries(synset, label), schema.IMAGE_ENCODED, image.jpeg, after
    )


@functools.lru_cache(maxsize=2048)
def _class_entries(synset: str, label: int) -> bytes:
    """The entries an image's Example shares with its class, which sort before ``image/encoded``."""
    return tfrecord.short_entries(
        {
            schema.LABEL: label,
            schema.SYNSET: synset.encode(),
            schema.CHANNELS: 3,
            schema.COLORSPACE: b"RGB",
        }
    )


# The splice above relies on the schema's key order: the class's entries sort before the image, the rest
# after.
assert (
    max(schema.LABEL, schema.SYNSET, schema.CHANNELS, schema.COLORSPACE)
    < schema.IMAGE_ENCODED
    < min(schema.FILENAME, schema.IMAGE_FORMAT, schema.HEIGHT, schema.WIDTH)
)
