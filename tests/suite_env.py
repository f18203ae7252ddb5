"""The environment the suite relies on, set by the suite rather than inherited from whoever runs it.

Shells used for machine learning often export variables that change what a test sees: ``PYTHONWARNINGS=ignore``
hides the warnings a console test expects in a log, ``TF_CPP_MIN_LOG_LEVEL=3`` or ``KERAS_BACKEND=jax`` change
what TensorFlow and Keras print and run, ``TF_CONFIG`` turns a trainer into a worker of somebody's cluster, a
key in ``GOOGLE_APPLICATION_CREDENTIALS`` would let a test reach Google. tests/conftest.py applies this table to
its own process before TensorFlow is imported, so every process a test starts inherits it too; the tests of
console output build their subprocesses' environments with ``child``. scripts/test.sh sets the same for pytest's
own interpreter (``PYTHONWARNINGS`` is read when Python starts, before any conftest).

Declares names only; imports nothing but the standard library.
"""

import os

# A directory that can never exist (a path below /dev/null): a library that looks for its configuration there
# finds none and uses its defaults, and one that tries to create it fails and goes on without.
NOWHERE = os.path.join(os.devnull, "effnet-tests")

# Set to these values, whatever the caller had.
PINNED = {
    # What the commands themselves default to (pipeline.local_runner, trainer_module and beam_preprocess set
    # it when unset): TensorFlow's C++ warnings and errors reach the logs, its informational lines do not.
    "TF_CPP_MIN_LOG_LEVEL": "2",
    # TensorFlow's default on x86 Linux, stated: oneDNN's kernels, whose float results the suite's figures
    # (top-1 thresholds, the determinism checks) were measured with.
    "TF_ENABLE_ONEDNN_OPTS": "1",
    # The suite runs on logical CPU devices (tests/conftest.py); on a machine with a GPU the same tests run on
    # the CPU, as the trainer subprocesses of test_train.py and test_tuning.py always did.
    "CUDA_VISIBLE_DEVICES": "",
    # Keras 3 on TensorFlow, its settings its defaults (no user's keras.json: floatx, image_data_format).
    "KERAS_BACKEND": "tensorflow",
    "KERAS_HOME": os.path.join(NOWHERE, "keras"),
    # No gcloud configuration (its application-default credentials, project, region) of the caller's.
    "CLOUDSDK_CONFIG": os.path.join(NOWHERE, "gcloud"),
    # Google's auth libraries probe the GCE metadata server for credentials: never, here (nothing may reach an
    # address but 127.0.0.1).
    "NO_GCE_CHECK": "True",
    "GCE_METADATA_HOST": "127.0.0.1:1",
    "GCE_METADATA_IP": "127.0.0.1:1",
}
# Pinned values a session fixture may point at a server of the suite's own on 127.0.0.1 for the rest of the
# session (tests/conftest.py's ``gce_metadata``: a metadata server, as cloud workers have).
LOCAL_SERVICES = ("GCE_METADATA_HOST", "GCE_METADATA_IP")

# Python's own, read when an interpreter starts (so scripts/test.sh clears them for pytest's): warning filters,
# asserts stripped, development mode's extra output, an interactive prompt after a script, a foreign copy of
# the packages ahead of this checkout's.
PYTHON_STARTUP = ("PYTHONWARNINGS", "PYTHONOPTIMIZE", "PYTHONDEVMODE", "PYTHONINSPECT", "PYTHONPATH")

# Removed, whatever the caller had.
CLEARED = (
    *PYTHON_STARTUP,
    # TensorFlow's and Keras's switches that change what runs or what is printed.
    "TF_CONFIG",
    "TPU_NAME",
    "TF_USE_LEGACY_KERAS",
    "TF_DETERMINISTIC_OPS",
    "TF_CUDNN_DETERMINISTIC",
    "TF_XLA_FLAGS",
    "XLA_FLAGS",
    "TF_CPP_MIN_VLOG_LEVEL",
    "TF_CPP_MAX_VLOG_LEVEL",
    "TF_CPP_VMODULE",
    "KERAS_MAX_EPOCHS",
    "KERAS_MAX_STEPS_PER_EPOCH",
    # Google Cloud identity and defaults.
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    "GCLOUD_PROJECT",
    "CLOUDSDK_CORE_PROJECT",
    "CLOUDSDK_COMPUTE_REGION",
    # Beam's: the interpreter and the services its cross-language transforms would start.
    "BEAM_PYTHON",
    "BEAM_SERVICE_OVERRIDES",
    # Vertex AI's training environment (CLUSTER_SPEC, AIP_MODEL_DIR, AIP_TENSORBOARD_LOG_DIR, ...): the fake
    # Vertex sets them per replica, as Vertex does.
    "CLUSTER_SPEC",
)
CLEARED_PREFIXES = (
    "AIP_",  # Vertex AI's training environment
    "KF_PIPELINES_",  # the Kubeflow Pipelines client's endpoint, token and OAuth settings
)


def child(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process a test starts: this process's (with what the suite set since, such as the
    GCS emulator's ``STORAGE_EMULATOR_HOST``), the table applied again, then ``extra``."""
    environ = dict(os.environ)
    apply(environ)
    return {**environ, **(extra or {})}


def apply(environ) -> None:
    """Sets PINNED and removes CLEARED (and names with CLEARED_PREFIXES) in ``environ``, a mapping such as
    ``os.environ``."""
    for name in [name for name in environ if name in CLEARED or name.startswith(CLEARED_PREFIXES)]:
        del environ[name]
    environ.update(PINNED)
