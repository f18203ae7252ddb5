"""Reading ImageNet as users hold it: archive indexing by offset, extracted directories, tfds copies."""

import os
import tarfile

import pytest

from beam_preprocess import sources
from effnet_common import schema


def _read_all(spec, members_per_unit=1000):
    units = list(sources.plan_units(spec, members_per_unit))
    return units, [item for unit in units for item in sources.read_unit(unit)]


def test_train_archive_is_indexed_by_offset_and_inner_tars_read_independently(clean_archives):
    spec = sources.InputSpec(schema.TRAIN, sources.KIND_TRAIN_ARCHIVE, clean_archives.train_archive)
    units, items = _read_all(spec)
    synsets = sorted(set(clean_archives.train.values()))
    assert [u.synset for u in units] == synsets
    assert all(u.kind == sources.UNIT_INNER_TAR and u.size > 0 for u in units)
    # Each unit reads on its own: reversed order gives the same images.
    reversed_items = [item for unit in reversed(units) for item in sources.read_unit(unit)]
    assert sorted(i.filename for i in reversed_items) == sorted(i.filename for i in items)
    assert {i.filename: i.synset for i in items} == clean_archives.train
    # The bytes are exactly the archive member's bytes.
    with tarfile.open(clean_archives.train_archive) as outer:
        inner = tarfile.open(fileobj=outer.extractfile(f"{synsets[0]}.tar"))
        first = inner.getmembers()[0]
        expected = inner.extractfile(first).read()
    assert next(i.data for i in items if i.filename == first.name) == expected


def test_validation_archive_is_split_into_member_ranges_with_official_labels(clean_archives):
    spec = sources.InputSpec(schema.VALIDATION, sources.KIND_VAL_ARCHIVE, clean_archives.val_archive)
    units, items = _read_all(spec, members_per_unit=30)
    assert len(units) == -(-len(clean_archives.validation) // 30)
    assert all(len(u.members) <= 30 for u in units)
    assert {i.filename: i.synset for i in items} == clean_archives.validation
    assert all(i.error is None and i.data for i in items)


def test_every_bad_input_is_an_item_with_a_reason(quirky_archives):
    items = []
    for split, kind, path in [
        (schema.TRAIN, sources.KIND_TRAIN_ARCHIVE, quirky_archives.train_archive),
        (schema.VALIDATION, sources.KIND_VAL_ARCHIVE, quirky_archives.val_archive),
    ]:
        items += _read_all(sources.InputSpec(split, kind, path), members_per_unit=50)[1]
    errors = {i.source: i.error for i in items if i.error}
    assert any("../../" in src and "escape" in err for src, err in errors.items())
    assert any(
        src.endswith("[n99999999.tar]") and "not <known ILSVRC2012 synset>" in err
        for src, err in errors.items()
    )
    assert any(
        "not_an_official_name.JPEG" in src and "label is unknown" in err for src, err in errors.items()
    )
    corrupt = next(name for name, what in quirky_archives.bad.items() if what == "corrupt tar")
    assert any(src.endswith(f"[{corrupt}]") and "tar" in err for src, err in errors.items())
    # Undecodable bytes are read fine here; images.check_and_fix refuses them later in the pipeline.
    readable = {i.filename for i in items if i.error is None}
    assert set(quirky_archives.train) | set(quirky_archives.validation) <= readable


def test_extracted_directories_read_like_the_archives(clean_archives, tmp_path):
    train_dir, val_dir = tmp_path / "train", tmp_path / "val"
    with tarfile.open(clean_archives.train_archive) as outer:
        for member in outer.getmembers():
            synset_dir = train_dir / member.name[: -len(".tar")]
            synset_dir.mkdir(parents=True)
            tarfile.open(fileobj=outer.extractfile(member)).extractall(synset_dir, filter="data")
    with tarfile.open(clean_archives.val_archive) as val:
        val.extractall(val_dir, filter="data")
    (train_dir / "n00000000").mkdir()  # not a synset
    _, train_items = _read_all(sources.InputSpec(schema.TRAIN, sources.KIND_SYNSET_DIR, str(train_dir)))
    good = {i.filename: i.synset for i in train_items if i.error is None}
    assert good == clean_archives.train
    assert [i.error for i in train_items if i.error] == ["'n00000000' is not a known ILSVRC2012 synset"]

    # Flat validation directory: labels from the official list.
    _, val_items = _read_all(sources.InputSpec(schema.VALIDATION, sources.KIND_VAL_DIR, str(val_dir)), 25)
    assert {i.filename: i.synset for i in val_items} == clean_archives.validation

    # The same validation set laid out as val/<wnid>/.
    by_class = tmp_path / "val_by_class"
    for name, synset in clean_archives.validation.items():
        (by_class / synset).mkdir(parents=True, exist_ok=True)
        os.link(val_dir / name, by_class / synset / name)
    _, class_items = _read_all(sources.InputSpec(schema.VALIDATION, sources.KIND_VAL_DIR, str(by_class)))
    assert {i.filename: i.synset for i in class_items} == clean_archives.validation


@pytest.mark.parametrize(
    "name,refused",
    [
        ("n01440764_1.JPEG", False),
        ("train/n01440764/n01440764_1.JPEG", False),
        ("../n01440764_1.JPEG", True),
        ("a/../../b.JPEG", True),
        ("/etc/passwd", True),
        ("C:\\windows.JPEG", True),
    ],
)
def test_unsafe_member_names(name, refused):
    assert (sources.unsafe_member_reason(name) is not None) == refused


def test_unreadable_archive_is_one_failed_unit(tmp_path):
    path = tmp_path / "ILSVRC2012_img_train.tar"
    path.write_bytes(b"\x00" * 100 + b"not a tar archive at all" * 30)
    units = list(sources.plan_units(sources.InputSpec(schema.TRAIN, sources.KIND_TRAIN_ARCHIVE, str(path))))
    assert [u.kind for u in units] == [sources.UNIT_FAILED]
    (item,) = sources.read_unit(units[0])
    assert item.error.startswith("cannot read train_archive")
