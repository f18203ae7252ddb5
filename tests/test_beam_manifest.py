"""manifest.json: the typed round trip, the format written before it existed, and clear errors."""

import json
import subprocess
import sys

import pytest

from effnet_common import manifest as manifest_lib
from effnet_common.manifest import Failure, LabelConvention, Manifest, ManifestError, Shard, SplitManifest

# What beam_preprocess wrote before the Manifest module (version 1 without label_offset / num_classes),
# one local-relative and one absolute gs:// shard path.
EARLIER_MANIFEST = {
    "manifest_version": 1,
    "format": "tfrecord",
    "compression": "none",
    "feature_keys": ["image/encoded", "image/class/label"],
    "label_convention": "image/class/label is 0..999",
    "options": {"output_dir": "/data/out", "seed": 0},
    "splits": {
        "train": {
            "read": 5,
            "records": 4,
            "failed": 1,
            "fixed": {"png": 1, "cmyk": 0, "grayscale": 0, "other_mode": 0},
            "bytes": 300,
            "num_shards": 2,
            "directory": "train",
            "file_pattern": "train/train-*-of-*",
            "shards": [
                {"path": "train/train-00000-of-00002", "records": 2, "bytes": 150},
                {"path": "gs://b/out/train/train-00001-of-00002", "records": 2, "bytes": 150},
            ],
            "class_counts": {"n01440764": 4},
        }
    },
    "failures": [{"split": "train", "source": "a.tar[x.JPEG]", "reason": "empty file"}],
}


def _manifest(directory: str) -> Manifest:
    shards = tuple(
        Shard(f"{directory}/validation/validation-0000{i}-of-00002", 3 + i, 100 + i) for i in range(2)
    )
    return Manifest(
        splits={
            "validation": SplitManifest(
                name="validation",
                read=8,
                records=7,
                failed=1,
                bytes=201,
                directory="validation",
                file_pattern="validation/validation-*-of-*",
                shards=shards,
                fixed={"png": 0},
                class_counts={"n01440764": 7},
            )
        },
        label_convention=LabelConvention("labels 0..999", offset=0, num_classes=1000),
        feature_keys=("image/encoded",),
        options={"seed": 1},
        failures=(Failure("validation", "v.tar[y]", "truncated"),),
        directory=directory,
    )


@pytest.mark.parametrize("directory", ["gs://bucket/shards", "/tmp/shards", "ram://m/shards"])
def test_round_trip_writes_paths_relative_and_reads_them_resolved(directory):
    manifest = _manifest(directory)
    text = manifest.to_json()
    assert (
        json.loads(text)["splits"]["validation"]["shards"][0]["path"]
        == "validation/validation-00000-of-00002"
    )
    again = Manifest.from_json(text, directory=directory)
    assert again == manifest and again.to_json() == text
    split = again.split("validation")
    assert split.num_examples == 7 and split.num_shards == 2
    assert split.shard_paths == [f"{directory}/validation/validation-0000{i}-of-00002" for i in range(2)]
    assert [(s.records, s.bytes) for s in split.shards] == [(3, 100), (4, 101)]


def test_a_manifest_of_an_earlier_run_still_reads():
    manifest = Manifest.from_json(json.dumps(EARLIER_MANIFEST), directory="/data/out")
    train = manifest.split("train")
    assert train.num_examples == 4 and train.fixed["png"] == 1
    assert train.shard_paths == [
        "/data/out/train/train-00000-of-00002",
        "gs://b/out/train/train-00001-of-00002",
    ]
    assert manifest.label_convention == LabelConvention("image/class/label is 0..999", 0, 1000)
    assert manifest.failures == (Failure("train", "a.tar[x.JPEG]", "empty file"),)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda m: m.update(manifest_version=2), "manifest_version 2 is not read here"),
        (lambda m: m["splits"]["train"].update(read=6), "read 6 inputs but lists 4 records and 1 failures"),
        (lambda m: m["splits"]["train"].update(records=5, read=6), "5 records but its shards hold 4"),
        (lambda m: m["splits"]["train"].pop("shards"), "is not a beam_preprocess manifest: KeyError"),
        (lambda m: m["splits"]["train"].update(num_shards=3), "num_shards 3 but 2 shards listed"),
    ],
)
def test_bad_manifests_get_one_clear_error_naming_the_file(change, message):
    values = json.loads(json.dumps(EARLIER_MANIFEST))
    change(values)
    with pytest.raises(ManifestError, match="^gs://b/out/manifest.json") as raised:
        Manifest.from_json(json.dumps(values), directory="gs://b/out")
    assert message in str(raised.value)


def test_missing_split_names_the_splits_there_are():
    manifest = Manifest.from_json(json.dumps(EARLIER_MANIFEST), directory="gs://b/out")
    with pytest.raises(
        ManifestError, match=r"gs://b/out/manifest.json has no split 'validation' \(it has: train\)"
    ):
        manifest.split("validation")


def test_not_json_is_a_clear_error():
    with pytest.raises(ManifestError, match="^m.json is not a beam_preprocess manifest: JSONDecodeError"):
        Manifest.from_json("{not json", source="m.json")


def test_write_and_read_through_beam_file_systems(tmp_path):
    manifest = _manifest(str(tmp_path))
    path = str(tmp_path / manifest_lib.MANIFEST_NAME)
    manifest.write(path)
    assert Manifest.read(path) == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]  # no temporary file left


def test_importing_the_manifest_module_imports_neither_tensorflow_nor_beam():
    code = (
        "import sys; import effnet_common.manifest; "
        "print(sorted(m for m in ('tensorflow', 'apache_beam') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
