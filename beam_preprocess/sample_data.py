"""ILSVRC2012-style archives made from real images that ship with installed packages (no download).

- ``digits``: the 1,797 real scanned handwritten digits of scikit-learn, rendered as small RGB JPEGs and
  filed under ten real ILSVRC2012 synsets: the embedded default data of the demo.
- ``photos``: random crops of the real photographs scikit-learn ships (``load_sample_images``), re-scaled and
  JPEG-encoded at ImageNet-like sizes: what the benchmarks time.

``write_archives`` lays them out exactly like the real distribution: ``ILSVRC2012_img_train.tar`` holding one
``<wnid>.tar`` per synset of ``<wnid>_<n>.JPEG`` files, and a flat ``ILSVRC2012_img_val.tar`` of
``ILSVRC2012_val_<8 digits>.JPEG`` files whose labels are those of the official validation list. Optional
``quirks`` add the real set's oddities (a PNG named .JPEG, a CMYK JPEG, grayscale JPEGs) and ``bad_inputs``
add every kind of unusable input the pipeline must name in its failures.

Command line: ``python -m beam_preprocess.sample_data --out DIR [--kind photos --num-train N ...]``.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import random
import tarfile

import numpy as np
from PIL import Image

from effnet_common import schema, storage

KINDS = ("digits", "photos")
PHOTOS_DEFAULT_IMAGES = 3000
PHOTOS_DEFAULT_SYNSETS = 40
TRAIN_ARCHIVE = "ILSVRC2012_img_train.tar"
VAL_ARCHIVE = "ILSVRC2012_img_val.tar"

# The real oddities of ILSVRC2012 (names from tensorflow-datasets' lists).
PNG_NAME = "n02105855_2933.JPEG"
CMYK_NAME = "n01739381_1309.JPEG"


def default_synsets(count: int = 10) -> list[str]:
    """``count`` real ILSVRC2012 synsets spread over the label range (digit d -> the d-th of them)."""
    all_synsets = schema.synsets()
    step = len(all_synsets) // count
    return [all_synsets[i * step] for i in range(count)]


@dataclasses.dataclass(frozen=True)
class Sample:
    synset: str
    image: Image.Image  # mode RGB unless a quirk says otherwise


def digit_samples(size: int = 32, seed: int = 0) -> list[Sample]:
    """Every scikit-learn digit as a ``size``x``size`` RGB image (gray ink on a faintly tinted ground)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    synsets = default_synsets(10)
    rng = np.random.default_rng(seed)
    samples = []
    for pixels, digit in zip(digits.images, digits.target, strict=True):
        gray = (255 - pixels * (255.0 / 16.0)).astype(np.uint8)
        image = Image.fromarray(gray, mode="L").resize((size, size), Image.BICUBIC)
        tint = rng.integers(225, 256, size=3)  # a real RGB image, not three equal channels
        rgb = (np.asarray(image, dtype=np.float32)[..., None] * (tint / 255.0)).astype(np.uint8)
        samples.append(Sample(synsets[int(digit)], Image.fromarray(rgb, mode="RGB")))
    return samples


def photo_samples(
    count: int, num_synsets: int = 10, seed: int = 0, short_side: tuple[int, int] = (180, 375)
) -> list[Sample]:
    """``count`` distinct real-photo images: random crops of scikit-learn's sample photographs.

    Sizes follow ImageNet's (shorter side ``short_side`` px, default 180 to 375; aspect 3/4 to 4/3); synsets
    are assigned round-robin.
    """
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(a) for a in load_sample_images().images]
    synsets = default_synsets(num_synsets)
    rng = random.Random(seed)
    samples = []
    for i in range(count):
        photo = photos[i % len(photos)]
        crop_w = rng.randint(200, photo.width)
        crop_h = min(photo.height, max(150, int(crop_w * rng.uniform(0.75, 1.33))))
        left, top = rng.randint(0, photo.width - crop_w), rng.randint(0, photo.height - crop_h)
        image = photo.crop((left, top, left + crop_w, top + crop_h))
        short = rng.randint(*short_side)
        scale = short / min(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        samples.append(Sample(synsets[i % num_synsets], image))
    return samples


def encode_jpeg(image: Image.Image, quality: int = 90) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _cmyk_jpeg(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.convert("CMYK").save(out, format="JPEG", quality=90)
    return out.getvalue()


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0  # reproducible archives
    tar.addfile(info, io.BytesIO(data))


def _tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            _add(tar, name, data)
    return out.getvalue()


def validation_indices(synsets: list[str]) -> dict[str, list[int]]:
    """Official validation indices of each synset (50 each in the real list)."""
    wanted = set(synsets)
    by_synset = collections.defaultdict(list)
    for i, wnid in enumerate(schema.validation_synsets()):
        if wnid in wanted:
            by_synset[wnid].append(i)
    return by_synset


def validation_counts(samples: list[Sample], val_fraction: float) -> dict[str, int]:
    """How many images of each synset go to the validation archive.

    Raises:
      ValueError: a synset would need more than the official list's 50 validation images.
    """
    sizes = collections.Counter(sample.synset for sample in samples)
    slots = validation_indices(sorted(sizes))
    counts = {synset: round(size * val_fraction) for synset, size in sizes.items()}
    for synset in sorted(counts):
        if counts[synset] > len(slots[synset]):
            raise ValueError(
                f"{synset}: {counts[synset]} validation images asked, the official list has 50 per synset"
            )
    return counts


@dataclasses.dataclass
class ArchiveContents:
    """What ``write_archives`` wrote, for tests to check the pipeline against."""

    train_archive: str
    val_archive: str
    train: dict[str, str] = dataclasses.field(default_factory=dict)  # file name -> synset (usable images)
    validation: dict[str, str] = dataclasses.field(default_factory=dict)
    fixed: dict[str, str] = dataclasses.field(default_factory=dict)  # file name -> fix kind expected
    bad: dict[str, str] = dataclasses.field(default_factory=dict)  # a name in the failure source -> what


def write_archives(
    out_dir: str,
    samples: list[Sample],
    val_fraction: float = 0.2,
    quirks: bool = False,
    bad_inputs: bool = False,
    seed: int = 0,
    jpeg_quality: int = 90,
) -> ArchiveContents:
    """Writes ``ILSVRC2012_img_train.tar`` and ``ILSVRC2012_img_val.tar`` under ``out_dir``.

    Args:
      samples: the images and their synsets; each synset may put at most 50 images in validation (the
        official list has 50 per synset).
      val_fraction: share of each synset's images that goes to the validation archive.
      quirks: add a PNG named ``n02105855_2933.JPEG``, a CMYK JPEG ``n01739381_1309.JPEG`` and grayscale
        JPEGs (train and validation); the pipeline must turn them into RGB JPEGs.
      bad_inputs: add a truncated JPEG, an empty file, a text file named .JPEG, a member whose path escapes
        with '..', an inner tar of an unknown synset, a corrupt inner tar, and a validation file whose name
        is not an official one; the pipeline must name each in its failures.
    """
    rng = random.Random(seed)
    by_synset = collections.defaultdict(list)
    for sample in samples:
        by_synset[sample.synset].append(sample.image)
    val_slots = validation_indices(sorted(by_synset))
    contents = ArchiveContents(storage.join(out_dir, TRAIN_ARCHIVE), storage.join(out_dir, VAL_ARCHIVE))

    inner = {}  # synset -> [(member name, bytes)]
    val_members = []
    num_vals = validation_counts(samples, val_fraction)
    for synset in sorted(by_synset):
        group = by_synset[synset]
        num_val = num_vals[synset]
        for k, image in enumerate(group[num_val:]):
            name = f"{synset}_{k + 1}.JPEG"
            inner.setdefault(synset, []).append((name, encode_jpeg(image, jpeg_quality)))
            contents.train[name] = synset
        for k, image in enumerate(group[:num_val]):
            name = schema.validation_filename(val_slots[synset][k])
            val_members.append((name, encode_jpeg(image, jpeg_quality)))
            contents.validation[name] = synset

    some_image = samples[0].image
    if quirks:
        _add_quirks(inner, val_members, contents, some_image, val_slots, by_synset)
    if bad_inputs:
        _add_bad_inputs(inner, val_members, contents, some_image, val_slots)

    with (
        storage.open_write(contents.train_archive) as f,
        tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar,
    ):
        for synset in sorted(inner):
            members = inner[synset]
            if isinstance(members, bytes):  # a deliberately corrupt inner tar
                _add(tar, f"{synset}.tar", members)
                continue
            rng.shuffle(members)  # real inner tars are not in name order
            _add(tar, f"{synset}.tar", _tar_bytes(members))
    val_members.sort()
    with (
        storage.open_write(contents.val_archive) as f,
        tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar,
    ):
        for name, data in val_members:
            _add(tar, name, data)
    return contents


def _add_quirks(inner, val_members, contents, image, val_slots, by_synset) -> None:
    png_synset, cmyk_synset = PNG_NAME.split("_")[0], CMYK_NAME.split("_")[0]
    inner.setdefault(png_synset, []).append((PNG_NAME, _png(image)))
    inner.setdefault(cmyk_synset, []).append((CMYK_NAME, _cmyk_jpeg(image)))
    contents.train.update({PNG_NAME: png_synset, CMYK_NAME: cmyk_synset})
    contents.fixed.update({PNG_NAME: "png", CMYK_NAME: "cmyk"})
    synset = sorted(by_synset)[0]
    gray_name = f"{synset}_90001.JPEG"
    inner[synset].append((gray_name, encode_jpeg(image.convert("L"))))
    contents.train[gray_name] = synset
    contents.fixed[gray_name] = "grayscale"
    val_gray = _free_val_name(val_members, val_slots, synset)
    val_members.append((val_gray, encode_jpeg(image.convert("L"))))
    contents.validation[val_gray] = synset
    contents.fixed[val_gray] = "grayscale"


def _free_val_name(val_members, val_slots, synset) -> str:
    used = {name for name, _ in val_members}
    return next(
        schema.validation_filename(i) for i in val_slots[synset] if schema.validation_filename(i) not in used
    )


def _add_bad_inputs(inner, val_members, contents, image, val_slots) -> None:
    synset = sorted(inner)[0]
    good = encode_jpeg(image)
    bad_train = {
        f"{synset}_80001.JPEG": good[: len(good) // 2],  # truncated
        f"{synset}_80002.JPEG": b"",  # empty
        f"{synset}_80003.JPEG": b"this is a text file, not an image\n",
        f"../../{synset}_80004.JPEG": good,  # escapes the output directory
    }
    inner[synset].extend(bad_train.items())
    contents.bad.update(
        {
            f"{synset}_80001.JPEG": "truncated",
            f"{synset}_80002.JPEG": "empty",
            f"{synset}_80003.JPEG": "not an image",
            f"{synset}_80004.JPEG": "escapes",
        }
    )
    inner["n99999999"] = [("n99999999_1.JPEG", good)]  # not an ILSVRC2012 synset
    contents.bad["n99999999.tar"] = "unknown synset"
    corrupt = bytearray(_tar_bytes([("x.JPEG", good)]))
    corrupt[148:156] = b"garbage!"  # breaks the header checksum of the first member
    spared = {synset, "n99999999", PNG_NAME.split("_")[0], CMYK_NAME.split("_")[0]}
    other = sorted(s for s in inner if s not in spared)[0]
    inner[other] = bytes(corrupt)
    for name in list(contents.train):
        if contents.train[name] == other:
            del contents.train[name]  # its images are lost with the corrupt tar
    contents.bad[f"{other}.tar"] = "corrupt tar"
    val_members.append(("not_an_official_name.JPEG", good))
    contents.bad["not_an_official_name.JPEG"] = "unknown validation name"
    val_truncated = _free_val_name(val_members, val_slots, synset)
    val_members.append((val_truncated, good[: len(good) // 3]))
    contents.bad[val_truncated] = "truncated"


def write_digits_archives(out_dir: str, image_size: int = 32) -> ArchiveContents:
    """The embedded default data: scikit-learn's 1,797 digits as ILSVRC2012-style archives (20%
    validation)."""
    return write_archives(out_dir, digit_samples(image_size), val_fraction=0.2)


def build_parser():
    from effnet_common import console

    parser = console.ArgumentParser(
        prog="python -m beam_preprocess.sample_data", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, help="directory for the two archives (local or gs://)")
    parser.add_argument(
        "--kind",
        choices=KINDS,
        default="digits",
        help="digits (default): scikit-learn's 1,797 scanned digits in 10 synsets, the demo's data; photos: "
        "crops of scikit-learn's sample photographs at ImageNet-like sizes, for benchmarks",
    )
    parser.add_argument(
        "--num-images", type=int, help=f"photos: how many images in all (default {PHOTOS_DEFAULT_IMAGES})"
    )
    parser.add_argument(
        "--num-synsets",
        type=int,
        help=f"photos: over how many synsets (default {PHOTOS_DEFAULT_SYNSETS}; "
        f"at most {len(schema.synsets())})",
    )
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=0.2,
        help="share of each synset's images in the validation archive (default %(default)s; the official "
        "list has 50 validation images a synset)",
    )
    parser.add_argument(
        "--quirks", action="store_true", help="add the real set's PNG/CMYK/grayscale oddities"
    )
    parser.add_argument("--bad-inputs", action="store_true", help="add unusable inputs (tests of failures)")
    return parser


def samples_of(args) -> list[Sample]:
    """The images ``args`` ask for.

    Raises:
      console.UsageError: a photos-only flag with the digits, or counts out of range.
    """
    from effnet_common import console

    if args.kind == "digits":
        for flag, value in (("--num-images", args.num_images), ("--num-synsets", args.num_synsets)):
            if value is not None:
                raise console.UsageError(
                    flag,
                    value,
                    "goes with --kind photos: the digits are always scikit-learn's 1,797 in 10 synsets",
                )
        return digit_samples()
    images = PHOTOS_DEFAULT_IMAGES if args.num_images is None else args.num_images
    synsets = PHOTOS_DEFAULT_SYNSETS if args.num_synsets is None else args.num_synsets
    if not 1 <= synsets <= len(schema.synsets()):
        raise console.UsageError("--num-synsets", synsets, f"must be 1 to {len(schema.synsets())}")
    if images < synsets:
        raise console.UsageError("--num-images", images, f"must be at least --num-synsets ({synsets})")
    return photo_samples(images, synsets)


def main(argv=None) -> int:
    from effnet_common import console, path_checks, stopping

    with console.session():
        args = build_parser().parse_args(argv)
        try:
            if not 0.0 < args.val_fraction < 1.0:
                raise console.UsageError("--val-fraction", args.val_fraction, "must be between 0 and 1")
            samples = samples_of(args)
            try:
                validation_counts(samples, args.val_fraction)
            except ValueError as e:  # more validation images a synset than the official list has
                raise console.UsageError("--val-fraction", args.val_fraction, console.one_line(e)) from None
            path_checks.make_writable_directory("--out", args.out)
            with stopping.describe(f"no archive was written to {args.out}; run the same command again"):
                contents = write_archives(args.out, samples, args.val_fraction, args.quirks, args.bad_inputs)
        except console.UsageError as e:
            return console.fail(e)
    print(f"{contents.train_archive}: {len(contents.train)} usable training images")
    print(f"{contents.val_archive}: {len(contents.validation)} usable validation images")
    return 0


if __name__ == "__main__":
    from effnet_common import quick_exit

    quick_exit.exit_with(main())
