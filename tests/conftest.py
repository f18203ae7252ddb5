"""Test session set-up shared by every test module.

TensorFlow fixes its device list the first time it is touched, so the 8 logical CPU devices that the
distributed tests (MirroredStrategy, grouped batch norm) need are configured here, before any test runs.
Single-device code is unaffected: without a strategy, TensorFlow places work on the first CPU.
"""

import os

import suite_env

# The environment the suite relies on (tests/suite_env.py), set before TensorFlow is imported, whatever the
# caller exported; every process a test starts inherits it. An emulator the suite did not start is dropped too:
# the gcs_bucket fixture sets STORAGE_EMULATOR_HOST for the tests that use one.
suite_env.apply(os.environ)
os.environ.pop("STORAGE_EMULATOR_HOST", None)

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 8

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_LOGICAL_CPUS)]
)


@pytest.fixture(scope="session")
def logical_cpus():
    """Names of the logical CPU devices, for MirroredStrategy(devices=...)."""
    return [d.name for d in tf.config.list_logical_devices("CPU")]


@pytest.fixture(scope="session")
def quirky_archives(tmp_path_factory):
    """ILSVRC2012-style archives of the real digits holding every quirk and every kind of bad input."""
    from beam_preprocess import sample_data

    out = tmp_path_factory.mktemp("quirky_archives")
    return sample_data.write_archives(
        str(out), sample_data.digit_samples(size=24), val_fraction=0.2, quirks=True, bad_inputs=True
    )


@pytest.fixture(scope="session")
def clean_archives(tmp_path_factory):
    """ILSVRC2012-style archives of a few hundred real digits, no quirks, no bad inputs."""
    from beam_preprocess import sample_data

    out = tmp_path_factory.mktemp("clean_archives")
    return sample_data.write_archives(str(out), sample_data.digit_samples(size=24)[:400], val_fraction=0.25)


@pytest.fixture(scope="session")
def digit_shards(tmp_path_factory):
    """500 real digits (400 train / 100 validation, 32 px) sharded by beam_preprocess for 2 hosts into 4 + 2
    shards, in the layout of TFX's Examples artifact (``Split-<name>/`` beside ``manifest.json``, as the
    sharding step writes it), which the trainer, the tuner and TFX's executors all read.

    A dict: ``uri`` (the directory holding the manifest), the ``train`` and ``eval`` file patterns, and
    ``num_train`` / ``num_eval``. Shared by every test of the session: read it, never write into it.
    """
    from beam_preprocess import sample_data
    from beam_preprocess.config import ShardingConfig
    from beam_preprocess.run import run as shard

    root = tmp_path_factory.mktemp("digit_shards")
    archives = sample_data.write_archives(
        str(root / "archives"), sample_data.digit_samples(size=32)[:500], 0.2
    )
    uri = str(root / "examples")
    shard(
        ShardingConfig(
            output_dir=uri,
            train_archive=archives.train_archive,
            val_archive=archives.val_archive,
            num_hosts=2,
            train_shards=4,
            val_shards=2,
            split_dir_template="Split-{split}",
        )
    )
    return {
        "uri": uri,
        "train": f"{uri}/Split-train/train-*",
        "eval": f"{uri}/Split-validation/validation-*",
        "num_train": len(archives.train),
        "num_eval": len(archives.validation),
    }


# The suite runs on two pytest-xdist workers, a test module at a time on one worker (``--dist loadfile`` in
# scripts/test.sh: a module's fixtures, such as a trained pipeline, are built once). Modules are handed out in
# collection order, so the long ones go first and the short ones fill the gaps at the end; the figures are
# seconds of the whole suite on 2 loaded cores (2026-11-26), the order is all that matters. Unlisted modules
# keep their order, after.
LONG_MODULES_FIRST = (
    "test_vertex_steps.py",  # 520 s: the compiled pipeline's steps as their containers run them
    "test_tuning.py",  # 355 s: searches whose trials are trainer processes, a killed search resumed, TFX
    "test_pipeline.py",  # 327 s: the demo pipeline, its cached rerun, the tuned pipeline
    "test_train.py",  # 277 s: replicas in BN groups, SIGKILL and resume, multi-worker over loopback
    "test_run_cleanup.py",  # 102 s: a failed run's jobs cancelled by the exit task
    "test_faults.py",  # the fault tier: every cloud step under injected faults, two Beam steps on Dataflow
    "test_console.py",  # 90 s
    "test_efficientnet.py",  # 89 s
    "test_overfit.py",  # 88 s
    "test_preflight.py",  # 80 s
    "test_determinism.py",  # 76 s
    "test_gcs_storage.py",  # 59 s
    "test_export.py",  # 55 s
    "test_cloud_paths.py",  # 47 s
    "test_vertex.py",  # 41 s
    "test_vertex_training.py",  # 33 s
)


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONG_MODULES_FIRST.index(name) if name in LONG_MODULES_FIRST else len(LONG_MODULES_FIRST)

    items.sort(key=rank)  # stable: tests keep their order within a module


@pytest.fixture(autouse=True)
def _fresh_collective_keys():
    """Gives each test's MirroredStrategy its own collective group keys.

    Every MirroredStrategy numbers its collective groups from the same base, so a strategy over 2 devices
    and a later one over 8 would both claim group 1 with different sizes and abort ("joining a group with
    size 2, but that group has size 8"). TensorFlow's own strategy tests bump the base the same way.
    """
    tf.distribute.MirroredStrategy._collective_key_base += 100_000
    yield


@pytest.fixture(scope="session")
def gcs_bucket():
    """(emulator, "gs://effnet-test") : a GCS JSON-API server on 127.0.0.1, for the whole session.

    Beam's GCS client finds it through ``STORAGE_EMULATOR_HOST`` (set here, inherited by Beam's worker
    processes) and connects anonymously. Beam first looks for Google credentials and, finding none, retries for
    about 19 s before connecting anonymously; that happens once per process, here, before the first test.
    """
    from gcs_emulator import GcsEmulator

    from effnet_common import storage

    emulator = GcsEmulator()
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = emulator.host
    try:
        bucket = emulator.create_bucket("effnet-test")
        storage.write_text(f"{bucket}/warm-up", "credentials looked up")
        storage.remove([f"{bucket}/warm-up"])
        yield emulator, bucket
    finally:
        emulator.stop()
        if previous is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = previous
