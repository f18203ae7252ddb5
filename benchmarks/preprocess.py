"""beam_preprocess against tensorflow-datasets on a generated ILSVRC2012-style archive pair.

Four contenders prepare the same ``ILSVRC2012_img_train.tar`` + ``ILSVRC2012_img_val.tar`` of real-photo
JPEGs, each in a fresh Python process so that interpreter start, imports and worker start-up count the same
way:

- ``tfds``: ``tfds.builder('imagenet2012').download_and_prepare`` with the archives as its manual dir. It runs
  in one process and copies the JPEG bytes without decoding them.
- ``ours-1``: the ``python -m beam_preprocess`` command line on the in-process DirectRunner
  (``--direct_num_workers 1``).
- ``ours-2``: the same with ``--direct_num_workers 2 --direct_running_mode multi_threading``.
- ``ours-2p``: the same with ``--direct_num_workers 2 --direct_running_mode multi_processing``.

All of ours decode every image (see beam_preprocess.images). Reported per contender (best of ``--repeats`` runs, by wall time):
wall seconds, images/s (usable records written / wall), the ratio to tfds, the start-up share (interpreter and
library imports, measured by the child) with images/s over the rest, the CPU seconds of the whole
process tree (less moved by other load on the machine than wall time) and its peak RSS. The memory
part runs tfds and ours-2 at two dataset sizes (a size equal to ``--num-images`` reuses the throughput runs):
the peak must not grow with the dataset; the difference between the sizes also gives the cost of each extra
image with start-up cancelled out. Every run is checked: records counted in the written TFRecord files equal
the images generated, and our manifest lists no failures (every image decoded).

    .venv/bin/python benchmarks/preprocess.py            # defaults: 3000 images; memory at 1000 and 3000
    .venv/bin/python benchmarks/preprocess.py --quick    # a smoke run on tiny archives
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

import psutil

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # run as a script: the package is importable from the checkout

from beam_preprocess import sample_data  # noqa: E402

VAL_FRACTION = 0.2
MAX_VAL_PER_SYNSET = 50  # the official validation list has 50 images per synset
SAMPLE_INTERVAL_S = 0.05
GOAL_RATIO_TWO_WORKERS = 1.5
MIB = 2**20
MIN_LISTED_PROCESS_MIB = 16  # smaller processes (the shells that start Beam workers, lscpu) are not listed


# ----------------------------------------------------------------------------------------------------------
# Contenders


@dataclasses.dataclass(frozen=True)
class Contender:
    """One way of preparing the archives, run as ``python benchmarks/preprocess.py --child <name> ...``."""

    name: str
    description: str
    record_pattern: str  # glob of the written TFRecord files, relative to the output directory
    workers: int = 0  # DirectRunner workers (ours only)
    running_mode: str = ""  # DirectRunner --direct_running_mode with several workers


TFDS = Contender("tfds", "tfds imagenet2012", "imagenet2012/*/imagenet2012-*.tfrecord-*")
OURS_1 = Contender("ours-1", "beam_preprocess, 1 worker", "*/*-of-*", workers=1)
# Two threads: PIL and zlib release the GIL while decoding, and threads skip the per-process start-up.
OURS_2 = Contender(
    "ours-2", "beam_preprocess, 2 threads", "*/*-of-*", workers=2, running_mode="multi_threading"
)
OURS_2P = Contender(
    "ours-2p", "beam_preprocess, 2 processes", "*/*-of-*", workers=2, running_mode="multi_processing"
)
CONTENDERS = {c.name: c for c in (TFDS, OURS_1, OURS_2, OURS_2P)}


def beam_args(contender: Contender) -> list[str]:
    """DirectRunner options: in-process for one worker, threads or processes otherwise."""
    if contender.workers == 1:
        return ["--direct_num_workers", "1"]
    return ["--direct_num_workers", str(contender.workers), "--direct_running_mode", contender.running_mode]


def child_main(name: str, archives_dir: str, output_dir: str, result_path: str, launched_at: float) -> None:
    """Runs one contender in this (fresh) process and writes its timings and record counts to ``result_path``.

    Start-up (interpreter, the contender's library and TensorFlow, which both import sooner or later) ends
    when the imports are done; the work is everything after, worker start-up of the multi-process runner
    included.
    """
    contender = CONTENDERS[name]
    if contender is TFDS:
        import tensorflow  # noqa: F401 - tfds imports it lazily during preparation; count it as start-up
        import tensorflow_datasets as tfds
    else:
        from beam_preprocess import (
            __main__ as cli,
        )  # no TensorFlow: Examples and TFRecords are written in Python
    imported_at = time.time()
    result = {"startup_s": imported_at - launched_at}
    if contender is TFDS:
        builder = tfds.builder("imagenet2012", data_dir=output_dir)
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=archives_dir))
        result["records"] = {str(split): info.num_examples for split, info in builder.info.splits.items()}
        result["failures"] = []  # tfds does not decode, so it cannot find any
    else:
        argv = [
            "--train-archive",
            os.path.join(archives_dir, sample_data.TRAIN_ARCHIVE),
            "--val-archive",
            os.path.join(archives_dir, sample_data.VAL_ARCHIVE),
            "--output-dir",
            output_dir,
            *beam_args(contender),
        ]
        status = cli.main(argv)
        if status:
            raise SystemExit(f"beam_preprocess exited with status {status}")
        with open(os.path.join(output_dir, "manifest.json")) as f:
            manifest = json.load(f)
        result["records"] = {split: info["records"] for split, info in manifest["splits"].items()}
        result["failures"] = manifest["failures"]
    result["work_s"] = time.time() - imported_at
    with open(result_path, "w") as f:
        json.dump(result, f)


# ----------------------------------------------------------------------------------------------------------
# Measuring one run


@dataclasses.dataclass
class RunMeasurement:
    """What one run of one contender took."""

    contender: str
    num_images: int
    wall_s: float
    startup_s: float
    work_s: float
    cpu_s: float  # user + system CPU of the whole process tree
    records: int
    peak_tree_mib: float
    peak_process_mib: dict[str, float]  # "<role> <pid>" -> max RSS of that process

    @property
    def images_per_s(self) -> float:
        return self.records / self.wall_s

    @property
    def work_images_per_s(self) -> float:
        return self.records / self.work_s


class TreeMemorySampler:
    """Samples the summed RSS of a process and all its descendants every ``interval`` seconds (a thread).

    RSS counts shared library pages once per process, so the sum slightly overstates what the tree uses; it
    is the same measure for every contender and dataset size.
    """

    def __init__(self, pid: int, interval: float = SAMPLE_INTERVAL_S):
        self._root = psutil.Process(pid)
        self._interval = interval
        self._stop = threading.Event()
        self.peak_total = 0
        self.peak_by_process: dict[str, int] = {}
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self._interval)

    def _sample(self) -> None:
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        total = 0
        for process in processes:
            try:
                rss = process.memory_info().rss
                role = _process_role(process, self._root)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue  # exited between listing and reading
            total += rss
            key = f"{role} {process.pid}"
            self.peak_by_process[key] = max(self.peak_by_process.get(key, 0), rss)
        self.peak_total = max(self.peak_total, total)


def _process_role(process: psutil.Process, root: psutil.Process) -> str:
    if process.pid == root.pid:
        return "main"
    name = process.name()
    if name.startswith("python") and any("sdk_worker_main" in part for part in process.cmdline()):
        return "beam-worker"
    return name  # e.g. the shell that launches a Beam worker


def count_tfrecords(path: str) -> int:
    """Records in a TFRecord file, counted from its framing (8-byte length, 4-byte CRC, data, 4-byte CRC)."""
    count = 0
    with open(path, "rb") as f:
        while header := f.read(12):
            if len(header) != 12:
                raise ValueError(f"{path}: cut short after {count} records")
            (length,) = struct.unpack("<Q", header[:8])
            f.seek(length + 4, os.SEEK_CUR)
            count += 1
    return count


def children_cpu_s() -> float:
    """User + system CPU seconds of every descendant this process has waited for (workers included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def child_env() -> dict[str, str]:
    """The same environment for every contender: quiet TensorFlow and the checkout on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH", "")) if p)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    return env


def measure_run(contender: Contender, archives: Archives, run_dir: str) -> RunMeasurement:
    """Runs one contender in a fresh process, samples its memory, and checks what it wrote."""
    output_dir = os.path.join(run_dir, "out")
    log_path = os.path.join(run_dir, "log.txt")
    result_path = os.path.join(run_dir, "result.json")
    shutil.rmtree(run_dir, ignore_errors=True)  # left by an earlier benchmark in the same --workdir
    os.makedirs(run_dir)
    launched_at = time.time()
    child_args = [contender.name, archives.directory, output_dir, result_path, repr(launched_at)]
    command = [sys.executable, os.path.abspath(__file__), "--child", *child_args]
    cpu_before = children_cpu_s()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=child_env(), stdout=log, stderr=log)
        with TreeMemorySampler(process.pid) as sampler:
            process.wait()
        wall_s = time.time() - launched_at
    cpu_s = children_cpu_s() - cpu_before
    if process.returncode:
        raise RuntimeError(f"{contender.name} exited with status {process.returncode}; see {log_path}")
    with open(result_path) as f:
        result = json.load(f)
    verify_run(contender, archives, output_dir, result)
    shutil.rmtree(output_dir)  # the next run starts from nothing; disk stays small
    return RunMeasurement(
        contender=contender.name,
        num_images=archives.num_images,
        wall_s=wall_s,
        startup_s=result["startup_s"],
        work_s=result["work_s"],
        cpu_s=cpu_s,
        records=sum(result["records"].values()),
        peak_tree_mib=sampler.peak_total / MIB,
        peak_process_mib={k: v / MIB for k, v in sorted(sampler.peak_by_process.items())},
    )


def verify_run(contender: Contender, archives: Archives, output_dir: str, result: dict) -> None:
    """Every generated image is a record on disk, as many as the contender reports; none failed to decode."""
    if result["failures"]:
        raise RuntimeError(
            f"{contender.name}: {len(result['failures'])} images failed: {result['failures'][:5]}"
        )
    reported = sum(result["records"].values())
    files = glob.glob(os.path.join(output_dir, contender.record_pattern))
    on_disk = sum(count_tfrecords(path) for path in files)
    if not reported == on_disk == archives.num_images:
        raise RuntimeError(
            f"{contender.name}: {archives.num_images} images generated, {reported} reported, "
            f"{on_disk} records in {len(files)} files under {output_dir}"
        )


# ----------------------------------------------------------------------------------------------------------
# Data


@dataclasses.dataclass(frozen=True)
class Archives:
    directory: str
    num_images: int
    num_train: int
    num_val: int
    megabytes: float


def check_sizes(sizes: list[int], num_synsets: int) -> None:
    """Fails fast when a size cannot be generated (validation is capped at 50 images per synset)."""
    for size in sizes:
        per_synset = round(-(-size // num_synsets) * VAL_FRACTION)  # the fullest synset
        if per_synset > MAX_VAL_PER_SYNSET:
            raise SystemExit(
                f"error: {size} images over --num-synsets={num_synsets} puts about {per_synset} validation "
                f"images in each synset, more than the official {MAX_VAL_PER_SYNSET}: raise --num-synsets"
            )
        if size < num_synsets:
            raise SystemExit(f"error: {size} images cannot fill --num-synsets={num_synsets}")


def generate_archives(workdir: str, sizes: list[int], num_synsets: int) -> dict[int, Archives]:
    """One archive pair per size; the photos are made once, for the largest size, and sliced."""
    samples = sample_data.photo_samples(max(sizes), num_synsets)
    archives = {}
    for size in sorted(set(sizes)):
        directory = os.path.join(workdir, f"archives-{size}")
        contents = sample_data.write_archives(directory, samples[:size], val_fraction=VAL_FRACTION)
        megabytes = sum(os.path.getsize(p) for p in (contents.train_archive, contents.val_archive)) / MIB
        archives[size] = Archives(directory, size, len(contents.train), len(contents.validation), megabytes)
        if len(contents.train) + len(contents.validation) != size:
            raise RuntimeError(
                f"archives-{size}: wrote {len(contents.train) + len(contents.validation)} images"
            )
    return archives


# ----------------------------------------------------------------------------------------------------------
# The benchmark


def throughput_runs(archives: Archives, workdir: str, repeats: int) -> dict[str, list[RunMeasurement]]:
    """``repeats`` rounds of every contender, interleaved so that a burst of load hits all of them alike."""
    runs = {c.name: [] for c in CONTENDERS.values()}
    for round_index in range(repeats):
        for contender in CONTENDERS.values():
            run_dir = os.path.join(workdir, f"throughput-{contender.name}-{round_index}")
            measured = measure_run(contender, archives, run_dir)
            print(
                f"  round {round_index + 1}/{repeats} {contender.name:7s}: {measured.wall_s:6.1f}s wall, "
                f"{measured.images_per_s:6.1f} images/s",
                flush=True,
            )
            runs[contender.name].append(measured)
    return runs


def memory_runs(
    archives_by_size: dict[int, Archives],
    sizes: list[int],
    workdir: str,
    throughput: dict[str, list[RunMeasurement]],
) -> list[RunMeasurement]:
    """tfds and ours (2 workers) at each size, for their peak memory.

    A size that the throughput runs already covered is not run again: their best run (by wall time) is used.
    """
    runs = []
    for size in sizes:
        for contender in (TFDS, OURS_2):
            earlier = [r for r in throughput[contender.name] if r.num_images == size]
            if earlier:
                measured, source = best(earlier), "the best throughput run"
            else:
                run_dir = os.path.join(workdir, f"memory-{contender.name}-{size}")
                measured, source = measure_run(contender, archives_by_size[size], run_dir), "a new run"
            print(
                f"  {contender.name:7s} at {size} images: peak {measured.peak_tree_mib:7.1f} MiB, "
                f"{measured.wall_s:6.1f}s wall ({source})",
                flush=True,
            )
            runs.append(measured)
    return runs


def best(runs: list[RunMeasurement]) -> RunMeasurement:
    return min(runs, key=lambda r: r.wall_s)


def throughput_table(archives: Archives, runs: dict[str, list[RunMeasurement]]) -> tuple[str, dict]:
    """The throughput table and the ratios to tfds (whole run, and after start-up)."""
    tfds_best = best(runs[TFDS.name])
    lines = [
        f"Throughput: {archives.num_images} images ({archives.num_train} train + {archives.num_val} "
        f"validation, {archives.megabytes:.1f} MiB of JPEG), "
        f"best of {len(runs[TFDS.name])} runs by wall time",
        f"{'contender':28s} {'wall s':>7s} {'img/s':>7s} {'vs tfds':>8s} {'start-up s':>10s} "
        f"{'work s':>7s} {'work img/s':>10s} {'vs tfds':>8s} {'CPU s':>6s} {'peak MiB':>9s}  all walls",
    ]
    summary = {}
    for contender in CONTENDERS.values():
        r = best(runs[contender.name])
        ratio = r.images_per_s / tfds_best.images_per_s
        work_ratio = r.work_images_per_s / tfds_best.work_images_per_s
        walls = ", ".join(f"{x.wall_s:.1f}" for x in runs[contender.name])
        lines.append(
            f"{contender.description:28s} {r.wall_s:7.1f} {r.images_per_s:7.1f} {ratio:7.2f}x "
            f"{r.startup_s:10.1f} {r.work_s:7.1f} {r.work_images_per_s:10.1f} {work_ratio:7.2f}x "
            f"{r.cpu_s:6.1f} {r.peak_tree_mib:9.0f}  {walls}"
        )
        summary[contender.name] = {
            "wall_s": round(r.wall_s, 2),
            "images_per_s": round(r.images_per_s, 1),
            "ratio_vs_tfds": round(ratio, 3),
            "startup_s": round(r.startup_s, 2),
            "work_images_per_s": round(r.work_images_per_s, 1),
            "work_ratio_vs_tfds": round(work_ratio, 3),
            "cpu_s": round(r.cpu_s, 2),
            "median_wall_s": round(statistics.median(x.wall_s for x in runs[contender.name]), 2),
            "peak_tree_mib": round(r.peak_tree_mib, 1),
        }
    return "\n".join(lines), summary


def marginal_images_per_s(small: RunMeasurement, large: RunMeasurement) -> float | None:
    """Images/s of the extra images of the larger run: fixed start-up costs cancel out (noisy under load)."""
    extra_s = large.wall_s - small.wall_s
    return (large.records - small.records) / extra_s if extra_s > 0 else None


def marginal_cpu_ms_per_image(small: RunMeasurement, large: RunMeasurement) -> float | None:
    """CPU ms of each extra image of the larger run (fixed costs cancel out); None if not positive."""
    extra_cpu_s = large.cpu_s - small.cpu_s
    return extra_cpu_s / (large.records - small.records) * 1000 if extra_cpu_s > 0 else None


def memory_table(runs: list[RunMeasurement]) -> tuple[str, dict]:
    """Peak memory per contender and size, and its growth from the smaller size to the larger.

    The difference between the two runs also prices each extra image with start-up cancelled out.
    """
    lines = [
        f"Peak memory: RSS of the whole process tree, sampled every {SAMPLE_INTERVAL_S * 1000:.0f} ms",
        f"{'contender':28s} {'images':>7s} {'wall s':>7s} {'CPU s':>6s} {'peak MiB':>9s}  "
        "per-process max MiB",
    ]
    summary = {}
    for contender in (TFDS, OURS_2):
        small, large = sorted((r for r in runs if r.contender == contender.name), key=lambda r: r.num_images)
        for r in (small, large):
            per_process = ", ".join(
                f"{k} {v:.0f}" for k, v in r.peak_process_mib.items() if v >= MIN_LISTED_PROCESS_MIB
            )
            lines.append(
                f"{contender.description:28s} {r.num_images:7d} {r.wall_s:7.1f} {r.cpu_s:6.1f} "
                f"{r.peak_tree_mib:9.0f}  {per_process}"
            )
        growth = large.peak_tree_mib / small.peak_tree_mib
        marginal = marginal_images_per_s(small, large)
        cpu_ms = marginal_cpu_ms_per_image(small, large)
        not_slower = "n/a (not more than the smaller run's: noise exceeds the difference)"
        cost = (
            f"CPU ms each {f'{cpu_ms:.2f}' if cpu_ms else not_slower}, "
            f"images/s {f'{marginal:.0f}' if marginal else not_slower}"
        )
        lines.append(
            f"{'':28s} peak at {large.num_images} / at {small.num_images} images: {growth:.2f}x; "
            f"the extra images: {cost}"
        )
        summary[contender.name] = {
            "peak_tree_mib": {str(r.num_images): round(r.peak_tree_mib, 1) for r in (small, large)},
            "growth": round(growth, 3),
            "marginal_images_per_s": round(marginal, 1) if marginal else None,
            "marginal_cpu_ms_per_image": round(cpu_ms, 3) if cpu_ms else None,
        }
    return "\n".join(lines), summary


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=3000, help="images of the throughput archives")
    parser.add_argument("--num-synsets", type=int, default=40, help="synsets (<= 50 validation images each)")
    parser.add_argument(
        "--sizes",
        type=int,
        nargs=2,
        default=[1000, 3000],
        help="the two dataset sizes of the memory part (one equal to --num-images reuses its runs)",
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="throughput runs of each contender (best wins)"
    )
    parser.add_argument("--workdir", default="", help="keep archives and logs here (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and one round: a smoke run")
    # One run in a fresh process: NAME ARCHIVES_DIR OUTPUT_DIR RESULT_PATH LAUNCHED_AT.
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.num_images, args.sizes, args.repeats, args.num_synsets = 200, [100, 200], 1, 10
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        name, archives_dir, output_dir, result_path, launched_at = args.child
        child_main(name, archives_dir, output_dir, result_path, float(launched_at))
        return
    sizes = sorted(args.sizes)
    check_sizes([args.num_images, *sizes], args.num_synsets)
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-preprocess-")
    os.makedirs(workdir, exist_ok=True)
    started, load_at_start = time.time(), os.getloadavg()[0]
    try:
        print(
            f"Generating archives ({args.num_images}, {sizes[0]}, {sizes[1]} images) in {workdir}", flush=True
        )
        archives = generate_archives(workdir, [args.num_images, *sizes], args.num_synsets)
        print(f"  done in {time.time() - started:.0f}s; throughput runs:", flush=True)
        runs = throughput_runs(archives[args.num_images], workdir, args.repeats)
        print("Memory runs:", flush=True)
        mem_runs = memory_runs(archives, sizes, workdir, runs)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    table, throughput = throughput_table(archives[args.num_images], runs)
    mem_text, memory = memory_table(mem_runs)
    two_workers = throughput[OURS_2.name]["ratio_vs_tfds"]
    print()
    print(
        f"Machine: {os.cpu_count()} CPUs; 1-minute load average {load_at_start:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end (other work on the machine slows every contender)"
    )
    print(table)
    print()
    print(mem_text)
    print()
    print(
        f"Ratios vs tfds (images/s, whole run): 1 worker {throughput[OURS_1.name]['ratio_vs_tfds']:.2f}x, "
        f"2 workers {two_workers:.2f}x (goal >= {GOAL_RATIO_TWO_WORKERS}x: "
        f"{'met' if two_workers >= GOAL_RATIO_TWO_WORKERS else 'NOT met'}); "
        f"after start-up: 1 worker {throughput[OURS_1.name]['work_ratio_vs_tfds']:.2f}x, "
        f"2 workers {throughput[OURS_2.name]['work_ratio_vs_tfds']:.2f}x"
    )
    growth = memory[OURS_2.name]["growth"]
    print(f"Peak memory growth of ours (2 workers), {sizes[1]} vs {sizes[0]} images: {growth:.2f}x")
    print(
        f"Total benchmark time {time.time() - started:.0f}s; "
        "all runs verified (records = images generated, no failures)"
    )
    summary = {
        "num_images": args.num_images,
        "repeats": args.repeats,
        "throughput": throughput,
        "memory": memory,
        "goal_met": two_workers >= GOAL_RATIO_TWO_WORKERS,
        "memory_growth_ours_2": growth,
    }
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
