"""What a large-batch study run costs in CPU-seconds: this checkout against another (the code before a change).

Each checkout trains the study's LARS-256 run (``benchmarks/large_batch_study.py``: the tiny EfficientNet at 28
px, batch 256, ghost batch norm over 128, peak LR 4, evaluation every epoch; the settings built by that
checkout's own study script) on the study's tuning split (50,000 training images, 10,000 evaluated), as the
study does: ``python -m trainer_module`` with one CPU device, two runs side by side (seeds 0 and 1), this
checkout's runs with ``loop.cpu_threads=1`` (one core each, as the third design's runs), the other's with
whatever its code does. Every pair is run at two lengths (``--epochs``, 2 and 4 by default) so that the
per-epoch cost is the marginal one between them: process start, tracing, compiling and the export are paid
once a run and drop out. Printed: each run's CPU-seconds (user + system, of the trainer process and its
children) and wall seconds, the marginal CPU-seconds per epoch of each checkout, and their ratio; then one JSON
line.

Needs the study's shards (``large_batch_study.py`` makes them once under its work directory) and a checkout of
the code to compare with, e.g. ``git worktree add /tmp/before a5562c8`` (the code before issue 36's speed-ups).
Nothing else should run: the two runs of a pair share the machine's two cores.

    .venv/bin/python benchmarks/study_run_cost.py --before /tmp/before --work-dir /work/study-data  # ~15 min
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = (0, 1)
RUN = {"kind": "grid", "batch": 256, "lr": 4.0}  # the study's LARS-256 cell at its pick, on the tuning split

# Run inside the checkout's own code (its PYTHONPATH): writes the run's config as that checkout builds it.
_WRITE_CONFIG = """
import json, os, sys
checkout, out, run, threads, split = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sys.path.insert(0, os.path.join(checkout, "benchmarks"))
import large_batch_study as study
from trainer_module.config import replace
config = study.Run(**run).config(study.DESIGN, {"tune": json.loads(split)})
if threads:
    config = replace(config, {"loop.cpu_threads": threads})
with open(out, "w") as f:
    f.write(config.to_json())
"""


def tuning_split(work_dir: str) -> dict:
    """The study's tuning split as its script describes a split: shard patterns and record counts."""
    shards = os.path.join(work_dir, "tune")
    manifest = os.path.join(shards, "manifest.json")
    if not os.path.exists(manifest):
        raise SystemExit(f"{manifest}: no study shards there (large_batch_study.py makes them)")
    with open(manifest) as f:
        records = {name: split["records"] for name, split in json.load(f)["splits"].items()}
    return {
        "train": os.path.join(shards, "train", "train-*"),
        "eval": os.path.join(shards, "validation", "validation-*"),
        "num_train": records["train"],
        "num_eval": records["validation"],
    }


def run_pair(checkout: str, epochs: int, threads: int, split: dict, scratch: str) -> list[dict]:
    """Two runs of ``checkout``'s code side by side; their CPU and wall seconds."""
    env = dict(os.environ, PYTHONPATH=checkout, TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=scratch)
    children = []
    for seed in SEEDS:
        config = os.path.join(scratch, f"config-{seed}.json")
        run = json.dumps(dict(RUN, epochs=epochs, seed=seed))
        subprocess.run(
            [sys.executable, "-c", _WRITE_CONFIG, checkout, config, run, str(threads), json.dumps(split)],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        command = [sys.executable, "-m", "trainer_module", "--config", config, "--cpu-devices", "1"]
        command += ["--model-dir", os.path.join(scratch, f"run-{seed}")]
        command += ["--train-files", split["train"], "--eval-files", split["eval"]]
        log = open(os.path.join(scratch, f"run-{seed}.log"), "w")
        children.append((seed, time.perf_counter(), log, subprocess.Popen(command, cwd=checkout, env=env,
                                                                           stdout=log, stderr=log)))  # fmt: skip
    results = []
    for seed, start, log, child in children:
        _, status, usage = os.wait4(child.pid, 0)
        log.close()
        if os.waitstatus_to_exitcode(status) != 0:
            with open(log.name) as f:
                last = f.read().strip().splitlines()[-1:] or ["no output"]
            raise SystemExit(f"{checkout}: the {epochs}-epoch run of seed {seed} failed: {last[0]}")
        results.append(
            {
                "seed": seed,
                "epochs": epochs,
                "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
                "wall_seconds": round(time.perf_counter() - start, 1),
            }
        )
    return results


def marginal_per_epoch(runs: list[dict], short: int, long: int) -> float:
    """CPU-seconds per epoch between the two lengths, the mean of the seeds' pairs."""
    by = {(r["seed"], r["epochs"]): r["cpu_seconds"] for r in runs}
    return sum((by[(s, long)] - by[(s, short)]) / (long - short) for s in SEEDS) / len(SEEDS)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a checkout of the code to compare with")
    parser.add_argument(
        "--work-dir", required=True, help="large_batch_study.py's work directory (its shards)"
    )
    parser.add_argument("--epochs", type=int, nargs=2, default=(2, 4), metavar=("SHORT", "LONG"))
    args = parser.parse_args(argv)
    split = tuning_split(args.work_dir)
    short, long = args.epochs
    checkouts = {"before": (os.path.abspath(args.before), 0), "after": (REPO_ROOT, 1)}
    runs: dict[str, list[dict]] = {label: [] for label in checkouts}
    print(f"study run cost, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    for epochs in (short, long):
        for label, (checkout, threads) in checkouts.items():
            scratch = tempfile.mkdtemp(prefix=f"study_run_cost-{label}-")
            try:
                pair = run_pair(checkout, epochs, threads, split, scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            runs[label] += pair
            each = ", ".join(f"{r['cpu_seconds']:.0f} CPU-s / {r['wall_seconds']:.0f} s" for r in pair)
            print(f"  {label:<6} {epochs} epochs: {each}", flush=True)
    per_epoch = {label: marginal_per_epoch(runs[label], short, long) for label in checkouts}
    ratio = per_epoch["before"] / per_epoch["after"]
    print(
        f"\nmarginal CPU-s per epoch of {split['num_train']:,} images: before {per_epoch['before']:.1f}, after "
        f"{per_epoch['after']:.1f}: {ratio:.2f}x less CPU"
    )
    print(json.dumps({"benchmark": "study_run_cost", "runs": runs, "cpu_seconds_per_epoch": per_epoch,
                      "ratio": round(ratio, 3), "before": checkouts["before"][0]}))  # fmt: skip


if __name__ == "__main__":
    main()
