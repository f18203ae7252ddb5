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


# The suite runs on two pytest-xdist workers (``--dist loadgroup`` in scripts/test.sh), each taking the next unit
# of work when it is free. A unit is a module's tests, which share the module's fixtures (a trained pipeline is
# built once), except that a slow test using no fixture of its module's scope is a unit of its own: the long
# tests spread over both workers instead of queueing behind each other in one module. Units go out longest
# first, so the short ones fill the gaps at the end. The figures order them: seconds on 2 loaded cores as the
# whole suite measured them (``--durations``); unlisted units come after, in their order.
LONGEST_FIRST = {
    # 2026-11-29, the whole suite in 25:10 on 2 loaded cores (a module's figure sums its tests and fixtures; a lone
    # test's is its own); the four tests made shorter that day scaled by what each took alone before and after.
    "test_vertex_steps.py": 306,  # the compiled steps as their containers run them, one retried Trainer
    "tests/test_tuning.py::test_hyperband_continues_trials_from_their_checkpoints_and_a_killed_search_resumes": 212,
    "test_pipeline.py": 210,  # the demo stopped, resumed and run again, then with a target it cannot reach
    "tests/test_pipeline.py::test_a_rehearsed_pod_run_is_preempted_resumed_blessed_and_pushed_and_leaves_no_slice": 155,
    "tests/test_tpu_pods.py::test_the_compiled_trainer_task_trains_on_the_slice_and_the_exit_task_deletes_the_runs_slices": 120,
    "tests/test_vertex_steps.py::test_multi_worker_training_through_the_cloud_executor": 115,
    "test_faults.py": 104,
    "tests/test_train.py::test_sigkill_and_resume_finishes_bit_for_bit_like_an_uninterrupted_run": 95,
    "test_determinism.py": 91,
    "tests/test_pipeline.py::test_tuning_step_chooses_the_values_the_trainer_trains_with": 86,
    "test_efficientnet.py": 69,
    "tests/test_train.py::test_mirrored_replicas_in_bn_groups_count_every_eval_example": 61,
    "test_cloud_paths.py": 58,
    "tests/test_run_cleanup.py::test_a_failed_run_leaves_no_job_running[kubeflow]": 57,
    "tests/test_console.py::test_trainer_prints_one_line_per_evaluation_and_logs_to_the_model_dir": 56,
    "test_beam_pipeline.py": 56,
    "tests/test_train.py::test_multi_worker_mirrored_over_loopback": 56,
    "tests/test_train.py::test_weight_average_at_the_papers_decay_evaluates_close_to_the_raw_weights_and_survives_resume": 50,
    "test_gcs_storage.py": 47,
    "test_export.py": 46,
    "tests/test_run_cleanup.py::test_a_failed_run_leaves_no_job_running[vertex]": 44,
    "test_vertex_training.py": 44,
    "tests/test_tuning.py::test_a_truncated_run_resumed_to_the_end_equals_a_straight_run_bit_for_bit": 40,
    "tests/test_vertex_steps.py::test_sharding_step_reads_and_writes_gcs": 30,
    "test_public_apis.py": 29,
    "test_vertex.py": 27,
    "tests/test_beam_pipeline.py::test_ctrl_c_while_the_workers_shard_removes_everything_and_stops_them[multi_processing]": 26,
    "tests/test_report.py::test_ctrl_c_is_written_to_the_run_log_and_the_report_says_so": 26,
    "test_batchnorm.py": 24,
    "tests/test_overfit.py::test_micro_lars_grouped_bn_overfits_a_small_batch": 23,
    "tests/test_run_cleanup.py::test_sigterm_while_the_job_is_submitted_cancels_it_once_it_exists": 21,
    "tests/test_train.py::test_non_finite_loss_stops_with_a_clear_error_and_keeps_the_last_good_checkpoint": 20,
    "test_input_pipeline.py": 19,
    "tests/test_preflight.py::test_pipeline_step_failing_on_bad_inputs_is_one_line_not_a_traceback": 18,
    "tests/test_tfx_api.py::test_the_local_pipeline_and_its_executors_load_no_vertex_sdk": 18,
    "tests/test_run_cleanup.py::test_sigterm_while_the_job_runs_cancels_it": 17,
    "test_augment.py": 17,
    "tests/test_tpu_vm.py::test_sigterm_deletes_the_slice_and_a_step_killed_mid_run_is_reattached_by_its_retry": 16,
    "test_classes.py": 15,
}


def _unit(item) -> str:
    """The unit of work ``item`` belongs to: its module, or the test itself (see above)."""
    module = item.path.name
    if item.get_closest_marker("slow") is None:
        return module
    definitions = getattr(item, "_fixtureinfo", None)
    scopes = {
        fixture.scope
        for fixtures in (definitions.name2fixturedefs.values() if definitions else ())
        for fixture in fixtures
    }
    return module if "module" in scopes else item.nodeid.replace("@", "_")  # pytest-xdist splits at "@"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    units = {item.nodeid: _unit(item) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(units[item.nodeid]))
    items.sort(key=lambda item: -LONGEST_FIRST.get(units[item.nodeid], 0))  # stable within a unit


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The session's process (each pytest-xdist worker) exits without its slow last garbage collection
    (``effnet_common.quick_exit``): a worker not gone 10 s after the run is stopped before its exit handlers run."""
    import gc

    gc.freeze()


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
def gce_metadata():
    """A metadata server (tests/fake_gce_metadata.py) that the processes tests start from now on find, as a cloud
    worker finds its service account. This process's google-auth read the environment when it was imported."""
    from fake_gce_metadata import GceMetadataServer

    server = GceMetadataServer()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in server.environment().items():
            patch.setenv(name, value)
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def gcs_bucket(gce_metadata):
    """(emulator, "gs://effnet-test") : a GCS JSON-API server on 127.0.0.1, for the whole session.

    Beam's GCS client finds it through ``STORAGE_EMULATOR_HOST`` (set here, inherited by Beam's worker
    processes). Beam looks up Google's application-default credentials once per process and keeps what it
    found; finding none, it retries for about 35 s with backoff before going anonymous. The processes tests
    start find them as a cloud worker does, from the metadata server (``gce_metadata``); the emulator takes
    their tokens. In this process the lookup is answered at once with anonymous credentials.
    """
    import google.auth
    from gcs_emulator import GcsEmulator
    from google.auth.credentials import AnonymousCredentials

    from effnet_common import storage

    emulator = GcsEmulator()
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = emulator.host
    lookup = google.auth.default
    try:
        bucket = emulator.create_bucket("effnet-test")
        google.auth.default = lambda *args, **kwargs: (AnonymousCredentials(), None)
        try:
            storage.write_text(f"{bucket}/warm-up", "credentials looked up")  # Beam keeps the anonymous ones
        finally:
            google.auth.default = lookup
        storage.remove([f"{bucket}/warm-up"])
        yield emulator, bucket
    finally:
        emulator.stop()
        if previous is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = previous


# The images scripts/images.sh builds; the full suite (scripts/test.sh) builds them first.
LOCAL_IMAGES = {"pipeline": "effnet/pipeline:local", "trainer-tpu": "effnet/trainer-tpu:local"}


@pytest.fixture(scope="session")
def local_images() -> dict[str, str]:
    """The project's images, built here by a real Docker daemon, by target. CI must have them (scripts/test.sh
    builds them before the suite): there a missing image or daemon fails the test; elsewhere it is skipped,
    saying how to build them."""
    import shutil
    import subprocess

    docker = shutil.which("docker")
    missing = "docker is not installed" if not docker else ""
    for image in LOCAL_IMAGES.values() if docker else ():
        found = subprocess.run([docker, "image", "inspect", image], capture_output=True, text=True)
        if found.returncode:
            missing = (
                f"{image}: {found.stderr.strip().splitlines()[-1] if found.stderr.strip() else 'missing'}"
            )
            break
    if missing:
        message = f"{missing} (scripts/images.sh build pipeline trainer-tpu, with a Docker daemon)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return dict(LOCAL_IMAGES)
