"""Shard writers on GCS: reads in flight at once against one at a time, with a GCS-like round trip.

A training shard of ImageNet for 128 hosts (1,024 shards) takes one or two records from each of the ~1,000
synset units, so its writer asks GCS for about two ranges a record (the record's spill entry and its image),
each a request whose latency is most of its cost. This benchmark builds that regime at a small scale: real
photos of ImageNet's sizes in ``--synsets`` inner tars of ``--per-synset`` images, sharded into as many training
shards as a synset has images (so each shard takes about one record per unit), on the GCS JSON-API server of the
tests (``gcp-storage-emulator`` on 127.0.0.1, a ``dev`` dependency), which waits ``--latency-ms`` before handling
each request (a stand-in for the round trip to GCS; requests are still handled one at a time). It checks the
images once, then runs the shard-writing stage on its own with ``storage.OBJECT_STORE_READ_THREADS`` reads in
flight and with one, best of ``--rounds``, and prints requests, wall time, the ratio, and the time the requests'
latency alone would take one at a time (requests x latency). Both ways write byte-identical shards.

    .venv/bin/python benchmarks/gcs_shard_reads.py
    .venv/bin/python benchmarks/gcs_shard_reads.py --latency-ms 0   # what the threads cost without latency
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
import warnings

# google-cloud clients warn about Python 3.11's end of life on import (Beam imports them).
warnings.filterwarnings("ignore", category=FutureWarning)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))

from gcs_emulator import GcsEmulator  # noqa: E402

from beam_preprocess import pipeline, sample_data, sources, work  # noqa: E402
from beam_preprocess.config import ShardingConfig  # noqa: E402
from effnet_common import storage  # noqa: E402


def upload(local_path: str, url: str) -> str:
    with open(local_path, "rb") as f, storage.open_write(url) as out:
        out.write(f.read())
    return url


def write_stage(config: ShardingConfig, layouts, threads: int) -> tuple[float, list[dict]]:
    storage.OBJECT_STORE_READ_THREADS = threads
    tasks = [
        work.shard_task(layouts[split], index, pipeline.shard_path(config, layouts[split], index))
        for split, index in pipeline.shard_tasks(layouts)
    ]
    start = time.perf_counter()
    shards = [work.write_shard(task).as_row() for task in tasks]
    return time.perf_counter() - start, shards


def digests(shards: list[dict]) -> list[str]:
    out = []
    for shard in shards:
        with storage.open_read(shard["path"]) as f:
            out.append(hashlib.sha256(f.read()).hexdigest())
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synsets", type=int, default=48)
    parser.add_argument("--per-synset", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    threads = storage.OBJECT_STORE_READ_THREADS

    emulator = GcsEmulator()
    os.environ["STORAGE_EMULATOR_HOST"] = emulator.host
    try:
        bucket = emulator.create_bucket("bench")
        with tempfile.TemporaryDirectory(prefix="gcs_shard_reads-") as tmp:
            samples = sample_data.photo_samples(args.synsets * args.per_synset, num_synsets=args.synsets)
            local = sample_data.write_archives(tmp, samples, val_fraction=0.0)
            train = upload(local.train_archive, f"{bucket}/in/ILSVRC2012_img_train.tar")
        config = ShardingConfig(output_dir=f"{bucket}/out", train_archive=train, train_shards=args.per_synset)
        units = [u for spec in config.input_specs() for u in sources.plan_units(spec, args.per_synset)]
        outcomes = [work.process_unit(work.UnitTask(unit, config.temp_dir, config.seed)) for unit in units]
        spills = [outcome.spill for outcome in outcomes if outcome.spill is not None]
        layouts = pipeline.build_layouts(spills, config)
        records = sum(s.count for s in spills)
        print(f"{records} records from {len(spills)} units into {layouts['train'].num_shards} shards on {bucket},"
              f" {args.latency_ms:g} ms before each request is handled")  # fmt: skip

        emulator.latency_s = args.latency_ms / 1000
        best: dict[int, float] = {}
        requests: dict[int, int] = {}
        shard_digests: dict[int, list[str]] = {}
        for _ in range(args.rounds):
            for n in (1, threads):
                emulator.reset_counts()
                seconds, shards = write_stage(config, layouts, n)
                requests[n] = emulator.media_gets()
                best[n] = min(best.get(n, seconds), seconds)
                emulator.latency_s, latency = 0.0, emulator.latency_s
                shard_digests[n] = digests(shards)
                emulator.latency_s = latency
        assert shard_digests[1] == shard_digests[threads], "the shards differ between 1 and several threads"

        print("| reads in flight | GETs | GETs / record | best wall s | records/s |")
        print("| --- | --- | --- | --- | --- |")
        for n in (1, threads):
            print(
                f"| {n} | {requests[n]:,} | {requests[n] / records:.2f} | {best[n]:.2f} | {records / best[n]:,.0f} |"
            )
        print(f"latency alone, one request at a time: {requests[1] * args.latency_ms / 1000:.2f} s")
        print(f"{threads} reads in flight: {best[1] / best[threads]:.2f}x the rate of one at a time"
              " (shards byte-identical)")  # fmt: skip
        storage.remove_tree(f"{bucket}/out")
    finally:
        emulator.stop()


if __name__ == "__main__":
    main()
