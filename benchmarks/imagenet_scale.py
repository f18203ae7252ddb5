"""Sharding rehearsal at ImageNet's full structure and cardinality: does peak memory stay flat?

Writes an ``ILSVRC2012_img_train.tar`` of 1,000 inner ``<wnid>.tar`` (the real synsets, 1,281,167 images named
``<wnid>_<n>.JPEG``) and a flat ``ILSVRC2012_img_val.tar`` of the 50,000 official ``ILSVRC2012_val_<n>.JPEG``
names (labels from the list tensorflow-datasets ships), every image a tiny real JPEG (scikit-learn's scanned
digits as rendered by ``beam_preprocess.sample_data``), into a temporary directory. Then shards them for 128
hosts (1,024 train / 128 validation shards) with ``python -m beam_preprocess`` on 2 multi-process DirectRunner
workers, sampling the RSS of the whole process tree (workers included) every 0.2 s; and does the same at 1/40
of the cardinality (same 1,000 synsets and shard counts, 1/40 of the images). Prints time, peak memory, bytes
read and written for both runs and the ratio of the peaks (goal: full / (1/40) <= 1.3).

    .venv/bin/python benchmarks/imagenet_scale.py               # full scale (a few minutes on 2 cores)
    .venv/bin/python benchmarks/imagenet_scale.py --scale 0.05  # 1/20 of ImageNet against 1/800
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings

# google-cloud clients warn about Python 3.11's end of life on import (Beam imports them).
warnings.filterwarnings("ignore", category=FutureWarning)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from preprocess import MIB, TreeMemorySampler, child_env  # noqa: E402

from beam_preprocess import sample_data  # noqa: E402
from effnet_common import schema  # noqa: E402
from effnet_common.manifest import Manifest  # noqa: E402

NUM_HOSTS = 128
TRAIN_SHARDS, VAL_SHARDS = 1024, 128
SMALL_FRACTION = 40
SAMPLE_INTERVAL_S = 0.2
GOAL_MEMORY_RATIO = 1.3


def train_counts(fraction: float) -> dict[str, int]:
    """Images per synset: 1,281,167 over the 1,000 synsets at fraction 1 (167 synsets get one more)."""
    total = round(schema.NUM_TRAIN_IMAGES * fraction)
    base, extra = divmod(total, schema.NUM_CLASSES)
    return {wnid: base + (i < extra) for i, wnid in enumerate(schema.synsets())}


def validation_indices(fraction: float) -> list[int]:
    """Official validation indices, evenly spread over the 50,000 (every one at fraction 1)."""
    count = round(schema.NUM_VALIDATION_IMAGES * fraction)
    return [i * schema.NUM_VALIDATION_IMAGES // count for i in range(count)]


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, _Bytes(data))


class _Bytes:
    """The file object tarfile copies member data from, without a BytesIO per image."""

    def __init__(self, data: bytes):
        self._data, self._pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._pos + n
        chunk, self._pos = self._data[self._pos : end], min(end, len(self._data))
        return chunk


def write_archives(directory: str, fraction: float, jpegs: list[bytes]) -> tuple[int, int, int]:
    """The two archives at ``fraction`` of ImageNet's cardinality; returns (train images, val images, bytes)."""
    os.makedirs(directory, exist_ok=True)
    train_path = os.path.join(directory, sample_data.TRAIN_ARCHIVE)
    val_path = os.path.join(directory, sample_data.VAL_ARCHIVE)
    counts = train_counts(fraction)
    image = 0
    with tarfile.open(train_path, "w", format=tarfile.USTAR_FORMAT) as outer:
        inner_path = os.path.join(directory, "inner.tar")
        for wnid, count in counts.items():
            with tarfile.open(inner_path, "w", format=tarfile.USTAR_FORMAT) as inner:
                for n in range(1, count + 1):
                    _add(inner, f"{wnid}_{n}.JPEG", jpegs[image % len(jpegs)])
                    image += 1
            outer.add(inner_path, arcname=f"{wnid}.tar")
        os.remove(inner_path)
    indices = validation_indices(fraction)
    with tarfile.open(val_path, "w", format=tarfile.USTAR_FORMAT) as val:
        for k, index in enumerate(indices):
            _add(val, schema.validation_filename(index), jpegs[k % len(jpegs)])
    size = os.path.getsize(train_path) + os.path.getsize(val_path)
    return sum(counts.values()), len(indices), size


def shard(archive_dir: str, output_dir: str) -> dict:
    """Runs ``python -m beam_preprocess`` (2 worker processes) on the archives; its time, memory and bytes."""
    command = [
        sys.executable, "-m", "beam_preprocess",
        "--train-archive", os.path.join(archive_dir, sample_data.TRAIN_ARCHIVE),
        "--val-archive", os.path.join(archive_dir, sample_data.VAL_ARCHIVE),
        "--output-dir", output_dir,
        "--num-hosts", str(NUM_HOSTS), "--train-shards", str(TRAIN_SHARDS), "--val-shards", str(VAL_SHARDS),
        "--direct_num_workers", "2", "--direct_running_mode", "multi_processing",
    ]  # fmt: skip
    log_path = output_dir.rstrip("/") + ".log"
    started = time.time()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT
        )
        with TreeMemorySampler(process.pid, interval=SAMPLE_INTERVAL_S) as sampler:
            process.wait()
    seconds = time.time() - started
    with open(log_path) as f:
        log_text = f.read()
    if process.returncode:
        raise RuntimeError(f"beam_preprocess exited with {process.returncode}:\n{log_text[-3000:]}")
    counters = dict(
        (k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", log_text.split("counters: ", 1)[1].split("\n")[0])
    )
    manifest = Manifest.read(os.path.join(output_dir, "manifest.json"))
    leftovers = [p for p in os.listdir(output_dir) if p not in ("manifest.json", "train", "validation")]
    if leftovers:
        raise RuntimeError(f"{output_dir} holds more than shards and manifest: {leftovers}")
    return {
        "seconds": round(seconds, 1),
        "peak_tree_mib": round(sampler.peak_total / MIB, 1),
        "peak_process_mib": {k: round(v / MIB) for k, v in sampler.peak_by_process.items() if v > 16 * MIB},
        "records": {name: split.num_examples for name, split in manifest.splits.items()},
        "archive_bytes_read": counters.get("bytes_read", 0),
        "spill_bytes_written": counters.get("spill_bytes_written", 0),
        "reread_bytes": counters.get("bytes_reread", 0),  # spill entries and images the shard writers read
        "shard_bytes_written": counters.get("bytes_written", 0),
    }


def trainer_plan(shards_dir: str, preset: str = "b5-lars-1024x65536") -> dict:
    """The trainer's per-host layout of ``preset`` over the shards, from their manifest (as every host computes
    it): files per host, steps, and an evaluation pass that counts each validation image exactly once."""
    import tensorflow as tf

    from trainer_module import presets, resolve
    from trainer_module.data import input_pipeline

    train_files = os.path.join(shards_dir, schema.TRAIN, f"{schema.TRAIN}-*")
    eval_files = os.path.join(shards_dir, schema.VALIDATION, f"{schema.VALIDATION}-*")
    try:
        sizes = resolve.data_sizes(train_files, eval_files)
        config = resolve.resolve_run(presets.get_preset(preset), data=sizes).config
    except ValueError as e:  # e.g. --scale too small for the preset's global batch
        return {"preset": preset, "skipped": str(e)}
    plan = config.plan
    listed_train, listed_eval = input_pipeline.list_files(train_files), input_pipeline.list_files(eval_files)
    train_per_host = {
        len(input_pipeline.pipeline_files(listed_train, plan.hosts, h)) for h in range(plan.hosts)
    }
    eval_per_host = {
        len(input_pipeline.pipeline_files(listed_eval, plan.hosts, h)) for h in range(plan.hosts)
    }
    context = tf.distribute.InputContext(plan.hosts, 0, plan.replicas)
    evaluation = input_pipeline.eval_plan(listed_eval, plan.eval_global_batch_size, context)
    if evaluation.num_examples != config.data.num_eval_examples:
        raise RuntimeError(f"the evaluation plan counts {evaluation.num_examples}, the manifest lists "
                           f"{config.data.num_eval_examples}")  # fmt: skip
    return {
        "preset": preset,
        "replicas": plan.replicas,
        "hosts": plan.hosts,
        "train_files_per_host": sorted(train_per_host),
        "eval_files_per_host": sorted(eval_per_host),
        "steps_per_epoch": plan.steps_per_epoch,
        "total_steps": plan.total_steps,
        "eval_steps": evaluation.steps,
        "eval_examples": evaluation.num_examples,
        "eval_padding": evaluation.num_padding,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help="fraction of ImageNet's cardinality (1 = full)"
    )
    parser.add_argument("--image-size", type=int, default=8, help="side of the tiny JPEGs in pixels")
    parser.add_argument(
        "--plan-preset", default="b5-lars-1024x65536", help="trainer preset whose per-host plan is checked"
    )
    args = parser.parse_args(argv)
    if not 0 < args.scale <= 1:
        parser.error(f"--scale must be in (0, 1], got {args.scale}")
    if args.scale / SMALL_FRACTION * schema.NUM_TRAIN_IMAGES < TRAIN_SHARDS:
        parser.error(f"--scale {args.scale}: the 1/{SMALL_FRACTION} run would have fewer images than shards")
    workdir = tempfile.mkdtemp(prefix="imagenet-scale-")
    results = {}
    try:
        jpegs = [sample_data.encode_jpeg(s.image) for s in sample_data.digit_samples(size=args.image_size)]
        for label, fraction in (("small", args.scale / SMALL_FRACTION), ("full", args.scale)):
            started = time.time()
            archives = os.path.join(workdir, f"archives-{label}")
            num_train, num_val, size = write_archives(archives, fraction, jpegs)
            print(
                f"{label}: wrote {num_train:,} train + {num_val:,} validation images ({size / MIB:.0f} MiB) "
                f"in {time.time() - started:.0f}s; sharding...",
                flush=True,
            )
            result = shard(archives, os.path.join(workdir, f"shards-{label}"))
            expected = {schema.TRAIN: num_train, schema.VALIDATION: num_val}
            if result["records"] != expected:
                raise RuntimeError(f"{label}: wrote {result['records']}, expected {expected}")
            result["fraction"] = fraction
            results[label] = result
            print(
                f"  {result['seconds']:.1f}s, peak {result['peak_tree_mib']:.0f} MiB "
                f"({result['peak_process_mib']}); read back by shard writers / shard bytes written "
                f"{result['reread_bytes'] / result['shard_bytes_written']:.3f}",
                flush=True,
            )
            shutil.rmtree(archives)
            if label == "small":
                shutil.rmtree(os.path.join(workdir, f"shards-{label}"))
        # After every memory measurement (TensorFlow's import would count otherwise): the trainer's per-host
        # plan of the paper's 1024-core slice, from the full run's manifest.
        per_host = trainer_plan(os.path.join(workdir, "shards-full"), args.plan_preset)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    small, full = results["small"], results["full"]
    ratio = full["peak_tree_mib"] / small["peak_tree_mib"]
    images = {k: sum(r["records"].values()) for k, r in results.items()}
    print()
    print(f"{'run':6s} {'images':>10s} {'seconds':>8s} {'img/s':>7s} {'peak MiB':>9s} {'archive MiB':>12s} "
          f"{'spill w MiB':>12s} {'reread MiB':>12s} {'shards MiB':>11s}")  # fmt: skip
    for label, r in results.items():
        print(
            f"{label:6s} {images[label]:10,d} {r['seconds']:8.1f} {images[label] / r['seconds']:7.0f} "
            f"{r['peak_tree_mib']:9.0f} {r['archive_bytes_read'] / MIB:12.1f} {r['spill_bytes_written'] / MIB:12.1f} "
            f"{r['reread_bytes'] / MIB:12.1f} {r['shard_bytes_written'] / MIB:11.1f}"
        )
    print(
        f"peak memory full / (1/{SMALL_FRACTION}): {ratio:.2f}x (goal <= {GOAL_MEMORY_RATIO}: "
        f"{'met' if ratio <= GOAL_MEMORY_RATIO else 'NOT met'})"
    )
    if "skipped" in per_host:
        print(f"trainer plan of {per_host['preset']} skipped at this scale: {per_host['skipped']}")
    else:
        print(
            f"trainer plan of {per_host['preset']} ({per_host['replicas']} replicas, {per_host['hosts']} hosts) "
            f"from the "
            f"manifest: {per_host['train_files_per_host']} training / {per_host['eval_files_per_host']} validation "
            f"files per host, {per_host['steps_per_epoch']:.3f} steps per epoch, {per_host['total_steps']} steps; "
            f"evaluation {per_host['eval_steps']} step(s) per pass, {per_host['eval_examples']:,} images counted "
            f"once each plus {per_host['eval_padding']:,} masked padding"
        )
    print(
        json.dumps(
            {"results": results, "peak_ratio": round(ratio, 3), "trainer_plan": per_host}, sort_keys=True
        )
    )


if __name__ == "__main__":
    main()
