"""Vertex AI custom training faked at its network client: ``python -m fake_vertex --record-dir DIR -- COMMAND``.

``COMMAND`` is a container's ``python -m MODULE ARGS...`` (the Trainer task's KFP entry point). It runs in this
process as ``python -m`` would run it, with one change: ``google.cloud.aiplatform.gapic.JobServiceClient``, the
client TFX's ``VertexJobClient`` (tfx/extensions/google_cloud_ai_platform/training_clients.py) builds, is
``FakeJobServiceClient``. Everything up to the network call is TFX's and this project's code: the job spec from
the Trainer's ``custom_config``, the worker pools' command TFX writes, the polling of the job's state.

``create_custom_job`` does what Vertex does with the request, on this machine:

1. checks it against the API's own ``aiplatform_v1.CustomJob`` message (an unknown field fails, as it would
   in the service) and records it, as sent, in ``DIR/custom_job-N.json`` (``parent``, ``api_endpoint``,
   ``custom_job``);
2. runs worker pool 0's container ``command`` + ``args`` (``python -m tfx.scripts.run_executor ...``) as a
   subprocess of this interpreter, with the variables Vertex sets on the replica of a one-replica job:
   ``CLUSTER_SPEC`` (pool ``workerpool0``) and ``TF_CONFIG`` (a ``chief`` task), each with the job spec; the
   replica's output goes to ``DIR/custom_job-N.workerpool0-0.log``;
3. returns the job in state ``JOB_STATE_SUCCEEDED``, or ``JOB_STATE_FAILED`` with the exit code in its error,
   which ``get_custom_job`` returns from then on.

The job runs to completion inside ``create_custom_job`` (Vertex returns a pending job and runs it meanwhile),
so TFX's first poll sees the final state and never sleeps. Jobs of more than one replica are refused: only the
primary replica could run here.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys

RECORD_FILE = "custom_job-{n}.json"
LOG_FILE = "custom_job-{n}.workerpool0-0.log"
# A Vertex replica's address: one host per replica of each pool, port 2222.
REPLICA_ADDRESS = "cmle-training-workerpool0-{job}-0:2222"

# Jobs created in this process, by resource name (TFX builds a new client for each call).
_JOBS: dict = {}
_record_dir = ""


def wrapper(record_dir: str) -> list[str]:
    """The command to put in front of a container's command (``kfp_launcher.run_task(wrapper=...)``, which puts
    ``tests/`` on the container's PYTHONPATH)."""
    return [sys.executable, "-m", "fake_vertex", "--record-dir", record_dir, "--"]


def replica_environment(job_spec: dict, job_id: str) -> dict[str, str]:
    """``CLUSTER_SPEC`` and ``TF_CONFIG`` of the one replica (pool 0, index 0) of a one-replica job."""
    address = REPLICA_ADDRESS.format(job=job_id)
    cluster_spec = {
        "cluster": {"workerpool0": [address]},
        "environment": "cloud",
        "task": {"type": "workerpool0", "index": 0},
        "job": job_spec,
    }
    tf_config = {
        "cluster": {"chief": [address]},
        "environment": "cloud",
        "task": {"type": "chief", "index": 0},
        "job": job_spec,
    }
    return {"CLUSTER_SPEC": json.dumps(cluster_spec), "TF_CONFIG": json.dumps(tf_config)}


class FakeJobServiceClient:
    """The two calls of ``google.cloud.aiplatform_v1.JobServiceClient`` that TFX's Vertex job client makes."""

    def __init__(self, client_options=None, **kwargs):
        options = client_options or {}
        self.api_endpoint = options.get("api_endpoint") if isinstance(options, dict) else options.api_endpoint

    def create_custom_job(self, parent: str, custom_job, **kwargs):
        from google.cloud import aiplatform_v1

        # The API's own message: an unknown field fails here, as it would in Vertex.
        job = aiplatform_v1.CustomJob(custom_job)
        number = len(_JOBS) + 1
        request = custom_job if isinstance(custom_job, dict) else aiplatform_v1.CustomJob.to_dict(job)
        record = {"parent": parent, "api_endpoint": self.api_endpoint, "custom_job": request}
        with open(os.path.join(_record_dir, RECORD_FILE.format(n=number)), "w") as f:
            json.dump(record, f, indent=1)

        pools = job.job_spec.worker_pool_specs
        replicas = sum(pool.replica_count for pool in pools)
        if replicas != 1:
            raise ValueError(f"fake Vertex runs one-replica jobs only; this one asks for {replicas} replicas")
        container = pools[0].container_spec
        argv = [*container.command, *container.args]
        if argv[0] == "python":
            argv[0] = sys.executable
        env = {**os.environ, **replica_environment(request["job_spec"], str(number))}
        log_path = os.path.join(_record_dir, LOG_FILE.format(n=number))
        with open(log_path, "wb") as log:
            code = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT).returncode

        job.name = f"{parent}/customJobs/{number}"
        if code:
            job.state = aiplatform_v1.JobState.JOB_STATE_FAILED
            job.error.code = 13  # INTERNAL
            job.error.message = (
                f"The replica workerpool0-0 exited with a non-zero status of {code} (log: {log_path})."
            )
        else:
            job.state = aiplatform_v1.JobState.JOB_STATE_SUCCEEDED
        _JOBS[job.name] = job
        return job

    def get_custom_job(self, name: str, **kwargs):
        return _JOBS[name]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fake_vertex", description=__doc__.split("\n\n")[0])
    parser.add_argument("--record-dir", required=True, help="where the CustomJob requests and logs go")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python -m MODULE ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if len(command) < 3 or command[1] != "-m":
        raise SystemExit(f"expected a container command 'python -m MODULE ...', got {command[:3]}")
    global _record_dir
    _record_dir = args.record_dir
    os.makedirs(_record_dir, exist_ok=True)

    from google.cloud.aiplatform import gapic

    gapic.JobServiceClient = FakeJobServiceClient
    sys.argv = [command[2], *command[3:]]
    runpy.run_module(command[2], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
