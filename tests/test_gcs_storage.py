"""beam_preprocess against a real GCS JSON-API server (gcp-storage-emulator on 127.0.0.1): the storage layer,
the command line from gs:// archives to gs:// shards, the TFX component's executor on gs://, and the bytes
read back from the spill objects measured at the server."""

import hashlib
import os

import pytest
from tfx import v1 as tfx

from beam_preprocess import __main__ as cli
from beam_preprocess import schema, storage, tfrecord
from beam_preprocess.config import ShardingConfig
from beam_preprocess.manifest import Manifest
from components import imagenet_shards

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _upload(local_path: str, url: str) -> str:
    with open(local_path, "rb") as f, storage.open_write(url) as out:
        out.write(f.read())
    return url


@pytest.fixture(scope="module")
def gcs_archives(gcs_bucket, clean_archives):
    """The clean archive pair, uploaded to the emulator's bucket."""
    _, bucket = gcs_bucket
    train = _upload(clean_archives.train_archive, f"{bucket}/inputs/ILSVRC2012_img_train.tar")
    val = _upload(clean_archives.val_archive, f"{bucket}/inputs/ILSVRC2012_img_val.tar")
    return train, val


def _filenames(shard_path: str) -> list[str]:
    with storage.open_read(shard_path) as f:
        return [tfrecord.decode_example(r)[schema.FILENAME][0].decode() for r in tfrecord.read_records(f)]


def _digests(paths: list[str]) -> list[str]:
    digests = []
    for path in paths:
        with storage.open_read(path) as f:
            digests.append(hashlib.sha256(f.read()).hexdigest())
    return digests


def test_storage_layer_on_gcs(gcs_bucket):
    emulator, bucket = gcs_bucket
    root = f"{bucket}/storage-layer"
    storage.write_text(f"{root}/a/b/c.txt", "x" * 1000 + "y" * 1000)
    storage.write_text(f"{root}/a/d.txt", "d")
    assert storage.list_dir(f"{root}/a") == [("b", True), ("d.txt", False)]
    emulator.reset_counts()
    assert list(storage.read_ranges(f"{root}/a/b/c.txt", [(995, 10), (1990, 10)])) == [
        b"xxxxxyyyyy",
        b"y" * 10,
    ]
    assert emulator.downloaded_bytes(root) == 20  # exactly the ranges asked for, no read-ahead
    with pytest.raises(OSError, match="cut short"):
        list(storage.read_ranges(f"{root}/a/d.txt", [(0, 5)]))
    with pytest.raises(FileNotFoundError, match="no such directory"):
        storage.list_dir(f"{root}/nothing")
    # Objects two levels down are deleted too (Beam's delete of 'dir/' stops at the first '/').
    assert storage.remove_tree(root) == 2
    assert emulator.list_objects("effnet-test", "storage-layer/") == []


def test_cli_shards_gcs_archives_into_gcs_leaving_only_shards_and_manifest(
    gcs_bucket, gcs_archives, clean_archives, tmp_path
):
    emulator, bucket = gcs_bucket
    train, val = gcs_archives
    out = f"{bucket}/cli-run"
    args = ["--train-archive", train, "--val-archive", val, "--num-hosts", "2", "--train-shards", "4"]
    args += ["--val-shards", "2", "--members-per-unit", "30"]
    emulator.reset_counts()
    assert cli.main([*args, "--output-dir", out]) == 0
    spill_bytes_read = emulator.downloaded_bytes(f"{out}/.beam_preprocess-tmp/")
    # Inputs: planning reads the headers (here, small archives, the whole of each) and each work unit reads its
    # own byte window, not the rest of a 16 MiB read-ahead: at most twice the archives.
    archive_bytes = sum(
        os.path.getsize(p) for p in (clean_archives.train_archive, clean_archives.val_archive)
    )
    input_bytes_read = emulator.downloaded_bytes(f"{bucket}/inputs/")
    print(f"archive bytes the server sent / archive bytes: {input_bytes_read} / {archive_bytes}")
    assert input_bytes_read <= 2.1 * archive_bytes

    manifest = Manifest.read(f"{out}/manifest.json")
    shard_paths = [p for split in manifest.splits.values() for p in split.shard_paths]
    assert emulator.list_objects("effnet-test", "cli-run/") == sorted([*shard_paths, f"{out}/manifest.json"])
    for split, expected in (
        (schema.TRAIN, clean_archives.train),
        (schema.VALIDATION, clean_archives.validation),
    ):
        info = manifest.split(split)
        names = [name for path in info.shard_paths for name in _filenames(path)]
        assert sorted(names) == sorted(expected) and info.num_examples == len(expected)
    # Each spill byte is fetched once: what the server sent from the spill objects against what was written.
    written = sum(split.bytes for split in manifest.splits.values())
    print(f"spill bytes the server sent / shard bytes written: {spill_bytes_read} / {written}")
    assert 0.9 <= spill_bytes_read / written <= 1.1, (spill_bytes_read, written)

    # The same inputs sharded on a local disk give the same bytes.
    local = tmp_path / "local"
    assert cli.main([*args, "--output-dir", str(local)]) == 0
    local_manifest = Manifest.read(str(local / "manifest.json"))
    local_paths = [p for split in local_manifest.splits.values() for p in split.shard_paths]
    assert _digests(local_paths) == _digests(shard_paths)


def test_component_executor_reads_and_writes_gcs(gcs_bucket, gcs_archives, clean_archives, tmp_path):
    emulator, bucket = gcs_bucket
    train, val = gcs_archives
    uri = f"{bucket}/pipeline-root/ImageNetShardGen/examples/1"
    config = ShardingConfig(
        output_dir="replaced", train_archive=train, val_archive=val, num_hosts=2, train_shards=2, val_shards=2
    )
    examples = tfx.types.standard_artifacts.Examples()
    examples.uri = uri
    beam_args = ["--direct_num_workers=1", f"--setup_file={os.path.join(REPO_ROOT, 'setup.py')}"]
    context = imagenet_shards.Executor.Context(
        beam_pipeline_args=beam_args, tmp_dir=str(tmp_path), unique_id="1"
    )
    imagenet_shards.Executor(context).Do(
        {},
        {imagenet_shards.EXAMPLES_KEY: [examples]},
        {imagenet_shards.SHARDING_CONFIG_KEY: config.to_json()},
    )
    assert examples.get_custom_property("train_records") == len(clean_archives.train)
    assert examples.get_custom_property("validation_records") == len(clean_archives.validation)
    prefix = "pipeline-root/ImageNetShardGen/examples/1/"
    expected = [f"{uri}/manifest.json"] + [
        f"{uri}/Split-{split}/{schema.shard_name(split, i, 2)}" for split in schema.SPLITS for i in range(2)
    ]
    assert emulator.list_objects("effnet-test", prefix) == sorted(expected)
