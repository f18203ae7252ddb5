"""beam_preprocess against a real GCS JSON-API server (gcp-storage-emulator on 127.0.0.1): the storage layer,
the command line from gs:// archives to gs:// shards, the TFX component's executor on gs://, and the bytes the
shard writers read back (spill entries and images from the archives) measured at the server."""

import hashlib
import os

import pytest

from beam_preprocess import __main__ as cli
from beam_preprocess import layout, pipeline, sample_data, sources, tfrecord, work
from beam_preprocess.config import ShardingConfig
from components import imagenet_shards
from components import tfx_api as tfx
from effnet_common import schema, storage
from effnet_common.manifest import Manifest

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


@pytest.mark.slow  # a Python process of its own importing Beam
def test_the_metadata_server_keeps_its_rules_and_a_new_process_reads_gcs_as_its_service_account(
    gcs_bucket, gce_metadata
):
    """A process the suite starts finds the worker's service account at once (no 35 s of Beam's retries), also
    when the metadata server is unavailable for a moment, and reaches the emulator with its token."""
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    _, bucket = gcs_bucket
    root = f"http://{gce_metadata.host}/computeMetadata/v1"
    with pytest.raises(urllib.error.HTTPError) as refused:  # no Metadata-Flavor header
        urllib.request.urlopen(f"{root}/project/project-id", timeout=5)
    assert refused.value.code == 403 and refused.value.headers["Metadata-Flavor"] == "Google"
    asked = urllib.request.Request(f"{root}/project/project-id", headers={"Metadata-Flavor": "Google"})
    assert urllib.request.urlopen(asked, timeout=5).read() == b"effnet-test-project"

    storage.write_text(f"{bucket}/metadata/hello.txt", "hello")
    tokens = gce_metadata.tokens_issued
    gce_metadata.fail_next(2)
    read = (
        "import sys\n"
        "from apache_beam.io.filesystems import FileSystems\n"
        "print(FileSystems.open(sys.argv[1]).read().decode())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", read, f"{bucket}/metadata/hello.txt"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "hello"
    assert "Connecting anonymously" not in done.stderr
    assert gce_metadata.tokens_issued > tokens  # the request to the emulator carried the account's token
    storage.remove([f"{bucket}/metadata/hello.txt"])


@pytest.mark.slow  # the CLI in a Python process of its own
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
    manifest = Manifest.read(f"{out}/manifest.json")
    written = sum(split.bytes for split in manifest.splits.values())
    # Inputs: planning reads the headers (here, small archives, the whole of each), each work unit reads its
    # own byte window, not the rest of a 16 MiB read-ahead, and the shard writers read each image again.
    archive_bytes = sum(
        os.path.getsize(p) for p in (clean_archives.train_archive, clean_archives.val_archive)
    )
    input_bytes_read = emulator.downloaded_bytes(f"{bucket}/inputs/")
    print(f"archive bytes the server sent / archive bytes: {input_bytes_read} / {archive_bytes}")
    assert input_bytes_read <= 2.1 * archive_bytes + 1.1 * written

    shard_paths = [p for split in manifest.splits.values() for p in split.shard_paths]
    assert emulator.list_objects("effnet-test", "cli-run/") == sorted([*shard_paths, f"{out}/manifest.json"])
    for split, expected in (
        (schema.TRAIN, clean_archives.train),
        (schema.VALIDATION, clean_archives.validation),
    ):
        info = manifest.split(split)
        names = [name for path in info.shard_paths for name in _filenames(path)]
        assert sorted(names) == sorted(expected) and info.num_examples == len(expected)

    # The same inputs sharded on a local disk give the same bytes.
    local = tmp_path / "local"
    assert cli.main([*args, "--output-dir", str(local)]) == 0
    local_manifest = Manifest.read(str(local / "manifest.json"))
    local_paths = [p for split in local_manifest.splits.values() for p in split.shard_paths]
    assert _digests(local_paths) == _digests(shard_paths)


@pytest.fixture(scope="module")
def gcs_photo_archives(gcs_bucket, tmp_path_factory):
    """Archives of photos of ImageNet's sizes (about 500x375 and smaller), uploaded to the emulator's bucket."""
    _, bucket = gcs_bucket
    local = sample_data.write_archives(
        str(tmp_path_factory.mktemp("photos")),
        sample_data.photo_samples(96, num_synsets=4),
        val_fraction=0.25,
    )
    train = _upload(local.train_archive, f"{bucket}/photos/ILSVRC2012_img_train.tar")
    val = _upload(local.val_archive, f"{bucket}/photos/ILSVRC2012_img_val.tar")
    return train, val


def _check_stage(config, members_per_unit: int) -> list[layout.UnitSpill]:
    """The checking stage run on its own: every unit's spill, written to the config's temp dir."""
    units = [u for spec in config.input_specs() for u in sources.plan_units(spec, members_per_unit)]
    outcomes = [work.process_unit(work.UnitTask(unit, config.temp_dir, config.seed)) for unit in units]
    return [outcome.spill for outcome in outcomes if outcome.spill is not None]


def _write_stage(config, layouts) -> list[dict]:
    tasks = [
        work.shard_task(layouts[split], index, pipeline.shard_path(config, layouts[split], index))
        for split, index in pipeline.shard_tasks(layouts)
    ]
    return [work.write_shard(task).as_row() for task in tasks]


def test_shard_writers_read_back_from_gcs_about_what_they_write(gcs_bucket, gcs_photo_archives, monkeypatch):
    """The shard-writing stage run on its own against the server: what the server sends it (spill entries and
    the images, read again from the archives by exact ranges) is within 1.1x of the shard bytes written, and the
    spill objects hold a few hundred bytes an image, not the images. Its reads are several in flight at once,
    which gives the same shards from the same requests as reading one at a time."""
    emulator, bucket = gcs_bucket
    train, val = gcs_photo_archives
    config = ShardingConfig(
        output_dir=f"{bucket}/stage-two", train_archive=train, val_archive=val, train_shards=4, val_shards=2
    )
    spills = _check_stage(config, members_per_unit=4)  # a training shard takes about one record per unit
    layouts = pipeline.build_layouts(spills, config)
    spill_bytes = sum(storage.size(s.path) for s in spills)

    emulator.reset_counts()
    emulator.latency_s = 0.03  # a round trip to GCS: reads issued together are then seen together
    try:
        shards = _write_stage(config, layouts)
    finally:
        emulator.latency_s = 0.0
    sent, gets = emulator.downloaded_bytes(f"{bucket}/"), emulator.media_gets()
    written = sum(shard["bytes"] for shard in shards)
    print(f"bytes the server sent to the shard writers / shard bytes written: {sent} / {written}")
    print(f"media GETs {gets} for {sum(s['records'] for s in shards)} records, at most {emulator.max_in_flight()}"
          " requests in flight")  # fmt: skip
    assert sum(shard["records"] for shard in shards) == 96
    assert 0.95 <= sent / written <= 1.1, (sent, written)
    assert spill_bytes < 0.05 * written, (spill_bytes, written)
    assert emulator.max_in_flight() >= storage.OBJECT_STORE_READ_THREADS, emulator.max_in_flight()
    threaded = _digests([shard["path"] for shard in shards])

    monkeypatch.setattr(storage, "OBJECT_STORE_READ_THREADS", 1)
    emulator.reset_counts()
    one_at_a_time = _write_stage(config, layouts)
    assert emulator.media_gets() == gets and emulator.downloaded_bytes(f"{bucket}/") == sent
    assert _digests([shard["path"] for shard in one_at_a_time]) == threaded
    assert storage.remove_tree(f"{bucket}/stage-two") == len(spills) + len(shards)


@pytest.mark.slow  # TFX's executor end to end
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
