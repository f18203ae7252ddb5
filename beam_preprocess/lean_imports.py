"""Keep Beam's import to what sharding uses: BigQuery, Pub/Sub, IPython and pandas are refused in our
processes.

``import apache_beam`` imports every connector whose client library is installed, each inside ``try: ...
except ImportError``. With ``apache-beam[gcp]`` and TFX's dependencies installed, that is BigQuery (whose tqdm
notebook widget pulls in IPython), Pub/Sub and several scans of every installed distribution by
google-api-core's version check; sharding uses none of them, and they double Beam's import time
(docs/performance.md, 'Sharding'). ``install()`` refuses exactly those packages
(``effnet_common.refused_imports``), so the connector imports take their ``except ImportError`` branch.

Only processes that run nothing but sharding on the DirectRunner install it: ``python -m beam_preprocess``
(unless it submits to another runner), whose ``multi_threading`` workers are its own threads and so lean too
(Beam's ``multi_processing`` workers import every connector: ``benchmarks/direct_workers.py``). Library
callers (the TFX executor, tests) never install it.
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
    "pandas",  # optional in Beam (DataFrame support and pandas type hints)
)
# Refused too when no path of the run is on an object store or HDFS (``local_only``): Beam's GCS file system
# (google-cloud-storage, apitools, oauth2client), its HDFS file system and the BigQuery and Pub/Sub transforms
# ``apache_beam.io`` imports beside GCS (Beam registers each file system only if it imports).
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
    """Refuses the packages from now on (with ``local_only``, those of ``LOCAL_ONLY_REFUSED`` too); returns
    False (and changes nothing) if one is already imported."""
    refused = REFUSED + (LOCAL_ONLY_REFUSED if local_only else ())
    return refused_imports.refuse(refused, "beam_preprocess's own processes")


def names_remote_paths(argv: list[str]) -> bool:
    """Whether any argument names a path on an object store or HDFS (a ``gs://`` input, output or temp
    location)."""
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
