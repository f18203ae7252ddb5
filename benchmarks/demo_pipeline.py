"""Wall time of the local demo pipeline by component, from archives to pushed model (goal: under 10 minutes).

Runs ``python -m pipeline.local_runner`` in a fresh process on a fresh pipeline root (nothing cached), then
reads each component's execution times back from the run's ML Metadata store. A second run on the same root
shows what the cache saves.

    .venv/bin/python benchmarks/demo_pipeline.py [--preset demo] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL_SECONDS = 600


def run_pipeline(root: str, preset: str) -> tuple[float, int]:
    start = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.local_runner", "--pipeline-root", root, "--preset", preset],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if result.returncode not in (0, 3):
        sys.exit(f"the pipeline failed:\n{result.stderr[-4000:]}")
    return time.time() - start, result.returncode


def component_times(metadata_path: str) -> list[tuple[int, str, str, float]]:
    """(execution id, component, state, seconds) of every execution, in order."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    store = metadata_store.MetadataStore(config)
    states = {v: k for k, v in metadata_store_pb2.Execution.State.items()}
    rows = []
    for execution in store.get_executions():
        name = store.get_execution_types_by_id([execution.type_id])[0].name.rsplit(".", 1)[-1]
        seconds = (execution.last_update_time_since_epoch - execution.create_time_since_epoch) / 1000
        rows.append((execution.id, name, states[execution.last_known_state], seconds))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--workdir", default="")
    args = parser.parse_args(argv)
    root = args.workdir or tempfile.mkdtemp(prefix="bench-demo-pipeline-")
    first_wall, first_code = run_pipeline(root, args.preset)
    first = component_times(os.path.join(root, "metadata.sqlite"))
    second_wall, _ = run_pipeline(root, args.preset)
    second = component_times(os.path.join(root, "metadata.sqlite"))[len(first) :]
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for title, rows, wall in (
        ("first run (nothing cached)", first, first_wall),
        ("second run", second, second_wall),
    ):
        print(f"\n{title}: {wall:.1f} s wall for the whole command (process start and imports included)")
        print(f"  {'component':<22} {'state':<9} {'seconds':>8}")
        for _, name, state, seconds in rows:
            print(f"  {name:<22} {state:<9} {seconds:>8.1f}")
    verdict = "met" if first_wall < GOAL_SECONDS else "NOT met"
    print(
        f"\nwhole demo {first_wall:.1f} s vs goal {GOAL_SECONDS} s: {first_wall / GOAL_SECONDS:.2f} of the budget ({verdict})"
    )
    print(
        json.dumps(
            {
                "first_run_seconds": round(first_wall, 1),
                "second_run_seconds": round(second_wall, 1),
                "pushed": first_code == 0,
                "components": {name: round(seconds, 1) for _, name, _, seconds in first},
                "goal_seconds": GOAL_SECONDS,
            }
        )
    )


if __name__ == "__main__":
    main()
