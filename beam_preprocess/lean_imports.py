"""Keep Beam's import to what sharding uses: BigQuery, Pub/Sub, IPython and pandas are refused in our processes.

``import apache_beam`` imports ``apache_beam.io``, which imports every connector whose client library is
installed, each inside ``try: ... except ImportError``. With ``apache-beam[gcp]`` (needed for GCS and
Dataflow) and TFX's dependencies installed, that is BigQuery (1.8 s, of which 0.8 s is tqdm's notebook widget
pulling in IPython), Pub/Sub (0.6 s) and four calls of google-api-core's Python-version check, each scanning
every installed distribution (0.3 s each). Sharding uses none of them. Measured here: a fresh interpreter
importing Beam and its SDK worker takes 3.4-3.7 s with them and 1.5-1.8 s without (pandas refused too).

``install()`` refuses exactly those packages (``effnet_common.refused_imports``), so Beam's connector imports take
their ``except ImportError`` branch. It is used only by processes that run nothing but sharding on the DirectRunner:
the ``python -m beam_preprocess`` command line (unless it submits to another runner), whose
``--direct_running_mode multi_threading`` workers are threads of that process and so lean too (Beam's
``multi_processing`` workers are processes of Beam's own, which import every connector: ``benchmarks/direct_workers.py`` measures what that costs).
Library callers (the TFX executor, tests) never install it.
"""

from __future__ import annotations

from effnet_common import refused_imports

REFUSED = (
    "google.cloud.bigquery",
    "google.cloud.bigquery_storage",
    "google.cloud.bigquery_storage_v1",
    "google.cloud.pubsub",
    "google.cloud.pubsub_v1",
    "google.pubsub_v1",
    "IPython",
    "ipywidgets",
    "pandas",  # optional in Beam (DataFrame support and pandas type hints); 0.3-0.5 s
)
# Refused too when no path of the run is on an object store or HDFS (``local_only``): Beam's GCS file system
# (google-cloud-storage, apitools, oauth2client: about 1.2 s), its HDFS file system (0.25 s) and the BigQuery and
# Pub/Sub transforms ``apache_beam.io`` imports beside GCS (Beam registers each file system only if it imports).
LOCAL_ONLY_REFUSED = (
    "apache_beam.io.gcp.gcsfilesystem",
    "apache_beam.io.hadoopfilesystem",
    "apache_beam.io.gcp.bigquery",
    "google.cloud.storage",
    "apitools",
    "oauth2client",
    "hdfs",
)
# The schemes that need those file systems: a command line naming one keeps them.
REMOTE_SCHEMES = ("gs://", "hdfs://")
DIRECT_RUNNERS = ("DirectRunner", "direct", "FnApiRunner", "SwitchingDirectRunner")


def install(local_only: bool = False) -> bool:
    """Refuses the packages from now on (with ``local_only``, those of ``LOCAL_ONLY_REFUSED`` too); returns False
    (and changes nothing) if one is already imported."""
    refused = REFUSED + (LOCAL_ONLY_REFUSED if local_only else ())
    return refused_imports.refuse(refused, "beam_preprocess's own processes")


def names_remote_paths(argv: list[str]) -> bool:
    """Whether any argument names a path on an object store or HDFS (a ``gs://`` input, output or temp location)."""
    return any(scheme in arg for arg in argv for scheme in REMOTE_SCHEMES)


def runs_on_direct_runner(argv: list[str]) -> bool:
    """True unless ``argv`` names a runner other than the DirectRunner (``--runner X`` or ``--runner=X``)."""
    runner = None
    for i, arg in enumerate(argv):
        if arg == "--runner" and i + 1 < len(argv):
            runner = argv[i + 1]
        elif arg.startswith("--runner="):
            runner = arg.split("=", 1)[1]
    return runner is None or runner in DIRECT_RUNNERS
