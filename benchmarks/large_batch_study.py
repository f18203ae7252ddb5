"""Does LARS keep a 16x batch as accurate in the same epochs? A small-scale test of the paper's Table 2 claim.

The question, the budget, the grids and the decision rule are fixed in ``DESIGN`` below and written out in
``docs/large_batch_study.md`` before the runs (``--design-only`` writes that section and trains nothing). The
script computes the verdict from the per-seed figures; nobody writes it by hand.

Phases, every run a ``python -m trainer_module`` process on one logical CPU replica, two side by side:

0. **Data and a simple reference.** Fashion-MNIST (Debian's ``dataset-fashion-mnist``, MIT) rendered as JPEGs
   under ten ImageNet synsets and sharded with ``beam_preprocess --classes found``: a tuning split (50,000
   training images, 10,000 held out of the training set) and the finals' split (60,000 / the 10,000 test
   images). The reference: scikit-learn's logistic regression on exactly the pixels the network is evaluated
   on (the trainer's own evaluation preprocessing), its C picked on the held-out split.
1. **LR grids at full length.** For each cell (LARS at the small and at the large batch) the peak learning
   rate is picked on the held-out split by runs of the finals' schedule length, one per grid point (seed 0).
   Each cell's grid is its own (absolute peak LRs, no scaling rule built in); when the pick lies at an edge of
   the grid, the grid is extended by one point beyond that edge, up to ``DESIGN.max_extensions`` times.
2. **Finals.** Each cell at its picked LR, ``DESIGN.seeds`` seeds, on the 60,000 images, top-1 on the test
   set at the end of training (averaged weights, as exported).
3. **Checks the decision rule needs.** The small batch at half the epochs (same seeds: is the baseline
   saturated?) and the large batch at twice the epochs (one seed: would more epochs close the gap?).

Every finished run is kept in ``--out-dir``/large_batch_study.json with its settings; a later invocation takes
every run found there whose settings match and does the rest, so the study runs in the background across
sessions from the committed JSON. The report (``.md``, ``.png``) is rewritten after every run.

    .venv/bin/python benchmarks/large_batch_study.py --design-only          # the design section, no runs
    .venv/bin/python benchmarks/large_batch_study.py --work-dir /tmp/study  # everything (about 12 CPU-hours)
    .venv/bin/python benchmarks/large_batch_study.py --report-only          # the .md/.png from the JSON
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import gzip
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the third design's module, beside this file

import epoch_multiplier  # noqa: E402 - the third design (beside this file)

from beam_preprocess import sample_data  # noqa: E402
from effnet_common import schema  # noqa: E402
from trainer_module.config import TrainerConfig, learning_rate_per_256, replace  # noqa: E402 - no TensorFlow
from trainer_module.presets import get_preset  # noqa: E402 - no TensorFlow

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_PACKAGE = "dataset-fashion-mnist"
# The ten Fashion-MNIST classes under the ImageNet synsets closest to them.
FASHION_SYNSETS = (
    "n03595614",  # 0 T-shirt/top: jersey, T-shirt
    "n03594734",  # 1 Trouser: jean
    "n04370456",  # 2 Pullover: sweatshirt
    "n03450230",  # 3 Dress: gown
    "n04479046",  # 4 Coat: trench coat
    "n04133789",  # 5 Sandal: sandal
    "n02963159",  # 6 Shirt: cardigan
    "n04120489",  # 7 Sneaker: running shoe
    "n04026417",  # 8 Bag: purse
    "n03124043",  # 9 Ankle boot: cowboy boot
)
# One training image in HELD_OUT_EVERY goes to the tuning split's evaluation set (10,000 of 60,000).
HELD_OUT_EVERY = 6
RESULTS = "large_batch_study.json"
REPORT = "large_batch_study.md"
PLOT = "large_batch_study.png"
SETTINGS_FILE = "study_settings.json"  # in a run's model directory: the settings it was started with
VERDICTS = ("reproduces", "refutes", "budget-limited")


@dataclasses.dataclass(frozen=True)
class Design:
    """What the study measures and how it decides, fixed before its runs (``docs/large_batch_study.md``).

    Attributes:
      small_batch / large_batch: the two global batches, 16x apart.
      epochs: every final run's epochs (both batches); the grids' runs have the same schedule.
      seeds: seeds of each cell's finals (and of the half-epoch check).
      image_size: the network's input side (Fashion-MNIST's native 28 px).
      lr_grids: each cell's initial grid of absolute peak learning rates, one run per point.
      grid_step: the ratio between neighbouring grid points; an extension adds one point beyond an edge.
      max_extensions: extensions per cell before the study gives up bracketing (the verdict then cannot be
        ``refutes``).
      trust_coefficient, warmup_share, end_lr: LARS' settings, fixed across cells (warmup as a share of the
        schedule, the paper's 50 of 350 epochs; end LR absolute).
      within_points: the claim's tolerance, in top-1 points (1.0).
      lower_points: how far below the interval's lower end may reach and still reproduce (1.5).
      saturation_points: the half-epoch baseline's largest shortfall for the baseline to count as saturated.
      confidence: of the Welch interval of the difference of means.
      target_top1: the fixed top-1 whose first crossing gives each run's steps to target.
      bn_examples: examples each batch-norm statistic is taken over, every run.
    """

    small_batch: int = 256
    large_batch: int = 4096
    epochs: int = 72
    seeds: int = 3
    image_size: int = 28
    lr_grids: tuple[tuple[int, tuple[float, ...]], ...] = (
        (256, (0.5, 1.0, 2.0, 4.0)),
        (4096, (2.0, 4.0, 8.0, 16.0)),
    )
    grid_step: float = 2.0
    max_extensions: int = 3
    trust_coefficient: float = 0.001
    warmup_share: float = 50 / 350
    end_lr: float = 0.0
    within_points: float = 1.0
    lower_points: float = 1.5
    saturation_points: float = 0.3
    confidence: float = 0.90
    target_top1: float = 0.85
    bn_examples: int = 128

    def grid(self, batch: int) -> tuple[float, ...]:
        return dict(self.lr_grids)[batch]

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values["lr_grids"] = {str(b): list(g) for b, g in self.lr_grids}
        return values


DESIGN = Design()


# ---------------------------------------------------------------------------------------------- the rule


def welch_interval(large: list[float], small: list[float], confidence: float) -> tuple[float, float, float]:
    """(difference of means large - small, lower end, upper end) of the Welch t interval at ``confidence``."""
    from scipy import stats

    a, b = np.asarray(large, float), np.asarray(small, float)
    delta = float(a.mean() - b.mean())
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return delta, delta, delta
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    return delta, delta - half, delta + half


def verdict(
    design: Design,
    baseline: list[float],
    large: list[float],
    half_epochs: list[float],
    long_run: float | None,
    picks_inside: bool,
) -> dict:
    """The decision rule on per-seed top-1 figures (fractions): reproduces, refutes or budget-limited.

    reproduces: the mean difference is at least -within and the interval's lower end at least -lower.
    refutes: the interval's upper end is below -within, the baseline is saturated (its half-epoch mean within
    ``saturation_points`` of its full mean), the large batch at twice the epochs is also more than ``within``
    short of the baseline, and every picked LR lies inside its grid.
    budget-limited: anything else, including fewer than ``design.seeds`` seeds in a cell (with two or more
    the difference and its interval are given, as an interim figure) or in the half-epoch check.
    """
    within, lower = design.within_points / 100, design.lower_points / 100
    result = {
        "delta": None,
        "delta_ci90": None,
        "saturated": None,
        "verdict": "budget-limited",
        "conditions": {},
    }
    if len(half_epochs) >= design.seeds and baseline:
        result["saturated"] = bool(np.mean(baseline) - np.mean(half_epochs) <= design.saturation_points / 100)
    if len(baseline) < 2 or len(large) < 2:
        return result
    delta, low, high = welch_interval(large, baseline, design.confidence)
    result.update(delta=delta, delta_ci90=[low, high])
    long_short = None if long_run is None else bool(long_run < np.mean(baseline) - within)
    conditions = {
        "reproduces": {
            f"mean difference >= -{design.within_points:g} pt": delta >= -within,
            f"interval's lower end >= -{design.lower_points:g} pt": low >= -lower,
        },
        "refutes": {
            f"interval's upper end < -{design.within_points:g} pt": high < -within,
            "baseline saturated": result["saturated"],  # None (as long_short): that check has not run yet
            f"twice the epochs also more than {design.within_points:g} pt short": long_short,
            "every pick inside its grid": picks_inside,
        },
    }
    result.update(conditions=conditions)
    if min(len(baseline), len(large)) < design.seeds:
        return result
    for name in ("reproduces", "refutes"):
        if all(met is True for met in conditions[name].values()):
            result["verdict"] = name
            break
    return result


def steps_to_target(history: list[dict], target: float) -> int | None:
    """The optimizer step of the first evaluation at or above ``target`` (None if never reached)."""
    return next((h["step"] for h in history if h["top1"] >= target), None)


def grid_state(
    design: Design, batch: int, scores: dict[float, float | None]
) -> tuple[list[float], float | None]:
    """(the grid as it stands, the pick once it is bracketed or the extensions are spent; else None).

    ``scores`` maps each finished grid point to its held-out top-1 (None: diverged). The pick is the best
    point; at an edge the grid grows by one point beyond it (a diverged point above the pick brackets it).
    """
    grid = sorted(set(design.grid(batch)) | set(scores))
    if any(lr not in scores for lr in grid):
        return grid, None
    finite = {lr: s for lr, s in scores.items() if s is not None}
    if not finite:  # every point diverged: go lower
        best = grid[0]
    else:
        best = max(sorted(finite), key=finite.get)  # a tie goes to the lower LR, whatever the order of runs
    extensions = len(grid) - len(design.grid(batch))
    if best == grid[0] and extensions < design.max_extensions:
        return [grid[0] / design.grid_step, *grid], None
    if best == grid[-1] and extensions < design.max_extensions:
        return grid + [grid[-1] * design.grid_step], None
    return grid, best


def inside(grid: list[float], picked: float | None) -> bool:
    return picked is not None and grid[0] < picked < grid[-1]


# ---------------------------------------------------------------------------------------------- data


def ensure_fashion_mnist() -> str:
    """The directory of Debian's Fashion-MNIST, installing the package first if it is missing."""
    if not os.path.exists(os.path.join(FASHION_DIR, "train-images-idx3-ubyte.gz")):
        print(
            f"[study] {FASHION_DIR} is missing: installing Debian's {FASHION_PACKAGE} (apt-get)", flush=True
        )
        subprocess.run(["apt-get", "install", "-y", "-qq", FASHION_PACKAGE], check=True)
    return FASHION_DIR


def read_idx(path: str) -> np.ndarray:
    """An IDX file (the MNIST format): big-endian dimensions after a 4-byte magic, then uint8 data."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _jpeg(pixels: np.ndarray) -> bytes:
    return sample_data.encode_jpeg(Image.fromarray(pixels).convert("RGB"), quality=95)


def render(train: tuple[np.ndarray, np.ndarray], evaluation: tuple[np.ndarray, np.ndarray], out: str):
    """The training images as an ILSVRC-style archive of per-synset tars, the evaluation images as the
    extracted val/<wnid>/ layout (the official validation names allow only 50 images per synset)."""
    os.makedirs(out, exist_ok=True)
    train_archive = os.path.join(out, sample_data.TRAIN_ARCHIVE)
    images, labels = train
    with tarfile.open(train_archive, "w", format=tarfile.USTAR_FORMAT) as outer:
        for label, synset in enumerate(FASHION_SYNSETS):
            members = [(f"{synset}_{k + 1}.JPEG", _jpeg(x)) for k, x in enumerate(images[labels == label])]
            sample_data._add(outer, f"{synset}.tar", sample_data._tar_bytes(members))
    val_dir = os.path.join(out, "val")
    images, labels = evaluation
    for label, synset in enumerate(FASHION_SYNSETS):
        os.makedirs(os.path.join(val_dir, synset), exist_ok=True)
        for k, x in enumerate(images[labels == label]):
            with open(os.path.join(val_dir, synset, f"{synset}_val_{k + 1}.JPEG"), "wb") as f:
                f.write(_jpeg(x))
    return train_archive, val_dir


def _shard(train, evaluation, work_dir: str, name: str) -> dict:
    """Renders and shards one split pair once (``beam_preprocess --classes found``); reuses the shards after."""
    shards = os.path.join(work_dir, name)
    manifest_path = os.path.join(shards, "manifest.json")
    if not os.path.exists(manifest_path):
        from beam_preprocess.config import ShardingConfig
        from beam_preprocess.run import run as shard

        start = time.time()
        raw = os.path.join(work_dir, f"raw-{name}")
        train_archive, val_dir = render(train, evaluation, raw)
        shard(
            ShardingConfig(
                output_dir=shards,
                train_archive=train_archive,
                val_dir=val_dir,
                num_hosts=1,
                train_shards=16,
                val_shards=8,
                classes="found",  # labels 0..9 and a 10-way head, not 1000 outputs for 10 classes
            )
        )
        shutil.rmtree(raw)
        print(f"[study] rendered and sharded the {name} split in {time.time() - start:.0f}s", flush=True)
    with open(manifest_path) as f:
        splits = json.load(f)["splits"]
    return {
        "train": os.path.join(shards, schema.TRAIN, f"{schema.TRAIN}-*"),
        "eval": os.path.join(shards, schema.VALIDATION, f"{schema.VALIDATION}-*"),
        "num_train": splits[schema.TRAIN]["records"],
        "num_eval": splits[schema.VALIDATION]["records"],
    }


def prepare_data(work_dir: str) -> dict[str, dict]:
    """{"tune": the training set minus every HELD_OUT_EVERY-th image / those images, "final": the training set
    / the test set}."""
    fashion = ensure_fashion_mnist()
    train = (
        read_idx(os.path.join(fashion, "train-images-idx3-ubyte.gz")),
        read_idx(os.path.join(fashion, "train-labels-idx1-ubyte.gz")),
    )
    test = (
        read_idx(os.path.join(fashion, "t10k-images-idx3-ubyte.gz")),
        read_idx(os.path.join(fashion, "t10k-labels-idx1-ubyte.gz")),
    )
    held_out = np.arange(len(train[1])) % HELD_OUT_EVERY == 0
    tune_split = _shard(
        (train[0][~held_out], train[1][~held_out]), (train[0][held_out], train[1][held_out]), work_dir, "tune"
    )
    return {"tune": tune_split, "final": _shard(train, test, work_dir, "final")}


# ---------------------------------------------------------------------------------------------- the reference


REFERENCE_C = (0.001, 0.01, 0.1, 1.0)


def evaluation_pixels(pattern: str, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The pixels the network is evaluated on (the trainer's centre crop and resize), one grey channel each
    (the rendered JPEGs are grey in RGB), scaled to [0, 1]; and the labels."""
    import tensorflow as tf

    from trainer_module.config import eval_crop_padding
    from trainer_module.data import input_pipeline

    def decode(record):
        example = input_pipeline.parse_example(record)
        image = input_pipeline.preprocess_for_eval(
            example[schema.IMAGE_ENCODED], image_size, eval_crop_padding(image_size)
        )
        return tf.reduce_mean(image, axis=-1), example[schema.LABEL]

    records = tf.data.TFRecordDataset(input_pipeline.list_files(pattern))
    images, labels = [], []
    for x, y in records.map(decode, num_parallel_calls=2).batch(2000):
        images.append(x.numpy().reshape(len(x), -1) / 255.0)
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels)


def simple_reference(data: dict, image_size: int) -> dict:
    """Logistic regression on the network's evaluation pixels: C picked on the held-out split among
    REFERENCE_C, refitted on the 60,000 training images, scored on the test set."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    def fit(c, x, y):
        return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=1000)).fit(x, y)

    start = time.process_time()
    tune_x, tune_y = evaluation_pixels(data["tune"]["train"], image_size)
    held_x, held_y = evaluation_pixels(data["tune"]["eval"], image_size)
    held_out = {c: float(fit(c, tune_x, tune_y).score(held_x, held_y)) for c in REFERENCE_C}
    best = max(held_out, key=held_out.get)
    train_x, train_y = evaluation_pixels(data["final"]["train"], image_size)
    test_x, test_y = evaluation_pixels(data["final"]["eval"], image_size)
    return {
        "model": "sklearn LogisticRegression (lbfgs, max_iter 1000) on standardised evaluation pixels",
        "image_size": image_size,
        "held_out_top1_by_c": {str(c): v for c, v in held_out.items()},
        "c_grid": list(REFERENCE_C),
        "c": best,
        "test_top1": float(fit(best, train_x, train_y).score(test_x, test_y)),
        "cpu_seconds": time.process_time() - start,
    }


# ---------------------------------------------------------------------------------------------- runs


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of the study: a batch at a peak LR for some epochs with a seed, on a split."""

    kind: str  # "grid" (tuning split), "final", "half" (half the epochs), "long" (twice the epochs), or
    # "budget" (the third design's end-of-schedule runs, epoch_multiplier.py)
    batch: int
    lr: float
    epochs: int
    seed: int

    @property
    def split(self) -> str:
        return "tune" if self.kind == "grid" else "final"

    @property
    def name(self) -> str:
        if self.kind == "grid":
            return f"grid-{self.batch}-lr{self.lr:g}"
        if self.kind == "budget":
            return f"budget-{self.batch}-e{self.epochs}-seed{self.seed}"
        return f"{self.kind}-{self.batch}-seed{self.seed}"

    def settings(self, design: Design, data: dict) -> dict[str, object]:
        """Every setting of the run as typed values by dotted key, pinned here so that edits of the demo
        preset leave the study as it is. They are also the run's identity in the results file."""
        split = data[self.split]
        settings = {
            "model.variant": "tiny",
            "model.precision": "float32",
            "model.image_size": design.image_size,
            "model.drop_connect_rate": 0.2,
            "model.bn_momentum": 0.9,  # 0.99 leaves the moving statistics of a short run near their start
            "model.bn_group_size": 1,
            "model.bn_virtual_batch": min(design.bn_examples, self.batch),
            "optimizer.name": "lars",
            "optimizer.lars_eeta": design.trust_coefficient,
            "optimizer.ema_decay": 0.9999,
            "optimizer.weight_decay": 1e-5,
            "optimizer.label_smoothing": 0.1,
            "schedule.kind": "polynomial",
            "schedule.lr_per_256": learning_rate_per_256(self.lr, self.batch),  # the peak is self.lr
            "schedule.warmup_epochs": _significant(design.warmup_share * self.epochs, 6),
            "schedule.end_lr": design.end_lr,
            "data.num_train_examples": split["num_train"],
            "data.num_eval_examples": split["num_eval"],
            "data.global_batch_size": self.batch,
            "data.eval_batch_size": 1000,
            "data.num_cores": 1,
            "data.replicas_per_host": 1,
            "data.min_crop_area": 0.5,
            "data.random_flip": True,
            "augment.policy": "none",
            "loop.train_epochs": self.epochs,
            "loop.eval_every_epochs": 1,
            "loop.target_top1": None,
            "loop.strategy": "mirrored",
            "loop.deterministic": False,
            "loop.seed": self.seed,
        }
        if self.kind == "budget":  # the third design's cheaper cadence and one core a run (same results)
            settings["loop.eval_every_epochs"] = max(1, self.epochs // 36)
            settings["loop.cpu_threads"] = 1
        return settings

    def config(self, design: Design, data: dict) -> TrainerConfig:
        """What the run trains with: the demo preset with the run's settings and name."""
        return replace(get_preset("demo"), {"name": f"study-{self.name}", **self.settings(design, data)})


def _significant(value: float, digits: int) -> float:
    """``value`` rounded to ``digits`` significant digits (the warmup's epochs, as the study records them)."""
    return float(f"{value:.{digits}g}")


class Results:
    """The study's results file: the reference and every finished run, written after each one (thread-safe)."""

    def __init__(self, path: str, design: Design):
        self.path = path
        self.lock = threading.Lock()
        self.runs: dict[str, dict] = {}
        self.reference: dict | None = None
        self.saved: dict = {}
        if os.path.exists(path):
            with open(path) as f:
                self.saved = json.load(f)
            if self.saved.get("design") is not None:  # the 20-epoch study's file has none: nothing to resume
                _check_same_design(path, self.saved["design"], design)
                self.runs = self.saved.get("runs", {})
                self.reference = self.saved.get("reference")

    def get(self, run: Run, settings: dict) -> dict | None:
        entry = self.runs.get(run.name)
        return entry if entry is not None and entry.get("settings") == settings else None

    def put(self, run: Run, entry: dict, write) -> None:
        with self.lock:
            self.runs[run.name] = entry
            write()


def _check_same_design(path: str, saved: dict, design: Design) -> None:
    """Stops when the results file was written under another design: its runs answer another question, and
    rewriting its report would rewrite the design fixed before the runs."""
    current = json.loads(json.dumps(design.to_dict()))
    changed = sorted(k for k in saved.keys() | current.keys() if saved.get(k) != current.get(k))
    if changed:
        raise SystemExit(
            f"[study] {path} holds runs of another design (differs in {', '.join(changed)}); "
            "restore the design or start the study with another --out-dir"
        )


def say(line: str) -> None:
    """A line on stdout in one write: runs report from threads side by side."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _child_env(temp_dir: str) -> dict:
    """A training's environment: this checkout's code, and ``temp_dir`` as its temporary directory (TensorFlow
    writes its autograph sources there and removes them only at a clean exit, not when a session's end kills
    the run)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")  # this checkout's code, not another's
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["TMPDIR"] = temp_dir
    return env


class Runner:
    """Trains the study's runs, at most ``jobs`` at a time, reusing every finished run of the results file."""

    def __init__(self, design: Design, data: dict, results: Results, work_dir: str, jobs: int, write):
        self.design, self.data, self.results, self.work_dir = design, data, results, work_dir
        self.slots = threading.Semaphore(jobs)
        self.write = write

    def __call__(self, run: Run) -> dict:
        settings = {"config": run.settings(self.design, self.data), "split": run.split}
        saved = self.results.get(run, settings)
        if saved is not None:
            return saved
        with self.slots:
            entry = self._train(run, settings)
        self.results.put(run, entry, self.write)
        return entry

    def _train(self, run: Run, settings: dict) -> dict:
        split = self.data[run.split]
        try:
            config = run.config(self.design, self.data)
        except (TypeError, ValueError) as error:  # before any directory is made
            raise SystemExit(f"[study] {run.name}: the trainer's config refuses a setting: {error}") from None
        model_dir = os.path.join(self.work_dir, "runs", run.name)
        resumed_at_epoch = prepare_model_dir(model_dir, settings)
        # The training's temporary files (its config among them), emptied before and after it: a killed run
        # leaves its files.
        temp_dir = os.path.join(self.work_dir, "tmp", run.name)
        shutil.rmtree(temp_dir, ignore_errors=True)
        os.makedirs(temp_dir)
        config_path = os.path.join(temp_dir, "config.json")
        command = [sys.executable, "-m", "trainer_module", "--config", config_path, "--model-dir", model_dir]
        command += ["--train-files", split["train"], "--eval-files", split["eval"], "--cpu-devices", "1"]
        where = f", resuming after epoch {resumed_at_epoch:g}" if resumed_at_epoch else ""
        say(f"[study] {run.name}: training {run.epochs} epochs at peak LR {run.lr:g}{where}")
        start = time.time()
        try:
            with open(config_path, "w") as f:
                f.write(config.to_json())
            with open(model_dir + ".log", "a" if resumed_at_epoch else "w") as log:
                child = subprocess.Popen(
                    command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=_child_env(temp_dir)
                )
                _, status, usage = os.wait4(child.pid, 0)
        finally:
            shutil.rmtree(temp_dir, ignore_errors=True)
        code = os.waitstatus_to_exitcode(status)
        entry = {
            "settings": settings,
            "name": run.name,
            **dataclasses.asdict(run),
            # Of the last attempt: a killed one reports nothing.
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "wall_seconds": time.time() - start,
        }
        if resumed_at_epoch:
            entry["resumed_at_epoch"] = resumed_at_epoch
        entry.update(_outcome(run, model_dir, code))
        shutil.rmtree(model_dir, ignore_errors=True)  # checkpoints and export: the JSON keeps what counts
        figure = "diverged" if entry["diverged"] else f"top-1 {entry['final_top1']:.4f}"
        say(f"[study] {run.name}: {figure} ({entry['cpu_seconds'] / 60:.0f} CPU-min)")
        return entry


def _outcome(run: Run, model_dir: str, code: int) -> dict:
    """A finished training's figures: its history and final top-1, or a divergence.

    Diverged means the trainer said the training loss became non-finite, or the final top-1 is not finite. Any
    other failure (an error or a kill, also after the last evaluation) stops the study with the run's model
    directory kept, so that running the study again resumes the run instead of counting it.
    """
    metrics_path = os.path.join(model_dir, "metrics.json")
    diverged = _diverged(model_dir + ".log")
    if os.path.exists(metrics_path) and (code == 0 or diverged):
        with open(metrics_path) as f:
            metrics = json.load(f)
        history = [{k: h[k] for k in ("epoch", "step", "top1") if k in h} for h in metrics["history"]]
        top1 = history[-1]["top1"]
        return {
            "history": history,
            "final_top1": top1,
            "steps": metrics["steps"],
            "diverged": diverged or not math.isfinite(top1),
        }
    if diverged:
        return {"history": [], "final_top1": None, "steps": None, "diverged": True}
    raise SystemExit(f"[study] {run.name} failed (exit {code}); see {model_dir}.log")


def prepare_model_dir(model_dir: str, settings: dict) -> float:
    """Readies a run's model directory; returns the epoch the run resumes after (0: from scratch).

    The trainer resumes from the last checkpoint in its model directory (one at every evaluation, named by its
    step, the seeded input stream continued), so a study stopped mid-run loses at most an epoch of each run
    in flight. That is only kept when the directory was started with the very same settings
    (``SETTINGS_FILE``); anything else there is removed and the run starts afresh.
    """
    marker = os.path.join(model_dir, SETTINGS_FILE)
    resumed_after = _epoch_of_checkpoint(model_dir) if _started_with(marker, settings) else 0.0
    if resumed_after:
        return resumed_after
    shutil.rmtree(model_dir, ignore_errors=True)
    os.makedirs(model_dir)
    with open(marker, "w") as f:
        json.dump(settings, f)
    return 0.0


def _started_with(marker: str, settings: dict) -> bool:
    try:
        with open(marker) as f:
            return json.load(f) == settings
    except (OSError, ValueError):  # none, or cut short by a kill
        return False


def _epoch_of_checkpoint(model_dir: str) -> float:
    """The epoch of the run's newest checkpoint (from the history written beside it), 0 if there is none."""
    step = _checkpoint_step(os.path.join(model_dir, "checkpoints"))
    try:
        with open(os.path.join(model_dir, "checkpoints", "history.json")) as f:
            done = [h["epoch"] for h in json.load(f) if h["step"] <= step]
    except (OSError, ValueError, KeyError, TypeError):  # none, or cut short by a kill
        return 0.0
    return float(done[-1]) if step and done else 0.0


def _checkpoint_step(checkpoint_dir: str) -> int:
    """The step of the newest checkpoint (TensorFlow's state file names it ``ckpt-<step>``), 0 if none."""
    state = os.path.join(checkpoint_dir, "checkpoint")
    if not os.path.exists(state):
        return 0
    with open(state) as f:
        match = re.search(r'^model_checkpoint_path: ".*ckpt-(\d+)"$', f.read(), re.MULTILINE)
    return int(match.group(1)) if match else 0


def _diverged(log_path: str) -> bool:
    with open(log_path) as f:
        return "training loss became" in f.read()


# ---------------------------------------------------------------------------------------------- the study


def tune_cell(design: Design, batch: int, runner: Runner) -> tuple[list[float], float | None]:
    """The cell's grid and pick: full-length runs on the held-out split, extended until the pick is inside."""
    scores: dict[float, float | None] = {}
    while True:
        grid, picked = grid_state(design, batch, scores)
        missing = [lr for lr in grid if lr not in scores]
        if not missing:
            return grid, picked
        with concurrent.futures.ThreadPoolExecutor(len(missing)) as pool:
            entries = pool.map(lambda lr: runner(grid_run(design, batch, lr)), missing)
            scores.update(zip(missing, map(_score, entries), strict=True))


def grid_run(design: Design, batch: int, lr: float) -> Run:
    return Run("grid", batch, lr, design.epochs, seed=0)


def _score(entry: dict) -> float | None:
    return None if entry["diverged"] else entry["final_top1"]


def planned_runs(design: Design, picks: dict[int, float]) -> list[Run]:
    """The runs after the grids: finals of both cells, the half-epoch baseline and the long large-batch run."""
    small, large = design.small_batch, design.large_batch
    runs = []
    for seed in range(design.seeds):
        runs += [Run("final", small, picks[small], design.epochs, seed)]
        runs += [Run("final", large, picks[large], design.epochs, seed)]
    runs += [Run("long", large, picks[large], 2 * design.epochs, 0)]
    runs += [Run("half", small, picks[small], design.epochs // 2, seed) for seed in range(design.seeds)]
    return runs


def summarise(design: Design, runs: dict[str, dict], reference: dict | None) -> dict:
    """The study's figures from its runs: grids and picks, per-seed finals, checks and the verdict."""
    small, large = design.small_batch, design.large_batch
    grids, picks = {}, {}
    for batch in (small, large):
        scores = {r["lr"]: _score(r) for r in runs.values() if r["kind"] == "grid" and r["batch"] == batch}
        grid, picked = grid_state(design, batch, scores)
        grids[batch] = {
            "grid": grid,
            "picked": picked,
            "held_out_top1": {f"{k:g}": v for k, v in scores.items()},
        }
        picks[batch] = picked

    def finals(kind: str, batch: int) -> list[dict]:
        return sorted(
            (
                r
                for r in runs.values()
                if r["kind"] == kind and r["batch"] == batch and r["lr"] == picks[batch]
            ),
            key=lambda r: r["seed"],
        )

    def top1s(entries):
        return [0.0 if r["diverged"] else r["final_top1"] for r in entries]

    baseline, large_runs = finals("final", small), finals("final", large)
    half, long = finals("half", small), finals("long", large)
    picks_inside = all(inside(grids[b]["grid"], picks[b]) for b in (small, large))
    rule = verdict(
        design,
        top1s(baseline),
        top1s(large_runs),
        top1s(half),
        top1s(long)[0] if long else None,
        picks_inside,
    )
    target_steps = {
        r["name"]: steps_to_target(r.get("history", []), design.target_top1)
        for r in baseline + large_runs + long
    }
    complete = len(baseline) >= design.seeds and len(large_runs) >= design.seeds and bool(long)
    complete = complete and len(half) >= design.seeds
    summary = {
        "small_batch": small,
        "large_batch": large,
        "epochs": design.epochs,
        "seeds": sorted({r["seed"] for r in baseline + large_runs}),
        "baseline_top1": top1s(baseline),
        "lars_large_top1": top1s(large_runs),
        "baseline_top1_mean": float(np.mean(top1s(baseline))) if baseline else None,
        "lars_large_top1_mean": float(np.mean(top1s(large_runs))) if large_runs else None,
        "delta": rule["delta"],
        "delta_ci90": rule["delta_ci90"],
        "verdict": rule["verdict"],
        "complete": complete,
        "baseline_half_epochs_top1": float(np.mean(top1s(half))) if half else None,
        "baseline_half_epochs_top1_each": top1s(half),
        "saturated": rule["saturated"],
        "verdict_conditions": rule["conditions"],
        "large_twice_epochs_top1": top1s(long)[0] if long else None,
        "picks_inside_grids": picks_inside,
        "simple_reference_top1": reference["test_top1"] if reference else None,
        "lr_grids": {
            f"lars-{b}": {"grid": grids[b]["grid"], "picked": grids[b]["picked"]} for b in (small, large)
        },
        "steps_to_target": {"target_top1": design.target_top1, "runs": target_steps},
    }
    return {"summary": summary, "grids": {str(b): g for b, g in grids.items()}}


# ---------------------------------------------------------------------------------------------- report


def design_section(design: Design, budget: dict | None = None) -> str:
    """The design, budget and decision rule in words, from ``design`` (the top of the report)."""
    d = design
    ratio = d.large_batch // d.small_batch
    grids = "; ".join(f"batch {b}: {', '.join(f'{x:g}' for x in g)}" for b, g in d.lr_grids)
    lines = [
        "## Design (fixed before the runs)",
        "",
        f"**Question.** Does LARS at {ratio}x the batch ({d.large_batch} against {d.small_batch}), trained for the "
        f"same number of epochs ({d.epochs}), end within {d.within_points:g} point of top-1 of the best "
        f"small-batch LARS run? That is the paper's Table 2 claim: B5 loses 0.5 points from RMSProp at 4,096 "
        "to LARS at 65,536 in the same 350 epochs.",
        "",
        "**Data and network.** Fashion-MNIST rendered as JPEGs under ten ImageNet synsets and sharded by "
        "`beam_preprocess --classes found` (10-way head). Tuning split: 50,000 training images, scored on 10,000 "
        "held out of the training set; finals: the 60,000 training images, scored on the 10,000 test images "
        "(never seen while tuning). The tiny EfficientNet at "
        f"{d.image_size} px (the data's native side; the 20-epoch study's 16 px left B0's last three stages 1x1 "
        f"maps), one replica per run, batch norm over {d.bn_examples} examples (ghost batches at the large "
        "batch), stochastic depth 0.2, dropout 0.2, weight decay 1e-5, label smoothing 0.1, weight averaging "
        "0.9999 with the reference's warm-up; inception crops of at least half the image and flips; top-1 of "
        "the averaged weights at the end of training.",
        "",
        f"**Fixed across cells.** LARS trust coefficient {d.trust_coefficient:g} (the paper's); warmup "
        f"{d.warmup_share:.4g} of the schedule (the paper's 50 of 350 epochs); polynomial (power 2) decay to an "
        f"end LR of {d.end_lr:g}.",
        "",
        f"**Tuned: each cell's peak LR**, picked by held-out top-1 at the end of runs of the finals' length "
        f"({d.epochs} epochs, seed 0) over a grid of absolute peak LRs per cell, neighbours {d.grid_step:g}x "
        f"apart (initial grids: {grids}; no scaling rule built in: each cell's grid is its own). A pick at an edge "
        f"extends that cell's grid by one point beyond it, up to {d.max_extensions} times; a diverged point above "
        "the pick brackets it.",
        "",
        f"**Finals.** Each cell at its pick, seeds 0-{d.seeds - 1}. Checks: the small batch at half the epochs "
        f"({d.epochs // 2}, the same seeds) and the large batch at twice the epochs ({2 * d.epochs}, seed 0).",
        "",
        f"**Decision rule.** Δ = mean(LARS-{d.large_batch}) - mean(LARS-{d.small_batch}) over the seeds, with "
        f"a Welch {d.confidence:.0%} interval.",
        f"- **reproduces** if Δ >= -{d.within_points:g} pt and the interval's lower end >= "
        f"-{d.lower_points:g} pt;",
        f"- **refutes** if the interval's upper end < -{d.within_points:g} pt, the baseline is saturated (the "
        f"half-epoch mean within {d.saturation_points:g} pt of the full mean), the large batch at twice the "
        f"epochs is also more than {d.within_points:g} pt short of the baseline mean, and every picked LR lies "
        "inside its grid;",
        "- **budget-limited** otherwise.",
        "",
        "Beside the rule: a simple reference on the very same pixels (scikit-learn's logistic regression on the "
        "network's evaluation input, C picked on the held-out split); and, from the same runs, the optimizer "
        f"steps each run needed to first reach top-1 {d.target_top1:g} (Shallue et al.'s steps-to-target "
        "axis).",
    ]
    lines += [
        "",
        "**Cheaper without changing what is computed.** One replica a run instead of the 20-epoch study's two "
        "logical CPU replicas: the same batch-norm groups (128 examples) and the same global-batch gradient, "
        "1.29x less wall time per epoch on one core (24.1 against 31.0 s at 16 px, 3 epochs each; 92 against 124 "
        "CPU-s a run). Tried and not taken: XLA-compiling the step (about 5x slower on this CPU at 32 px: 259 "
        "against about 1,300 images/s); the input pipeline alone runs 3-6x faster than the step, so it is not the limit.",
    ]
    if budget:
        lines += [
            "",
            f"**Budget.** {budget['runs']} runs of {budget['epoch_runs']} run-epochs in all on 50,000-60,000 "
            f"images; about {budget['cpu_hours']:.1f} CPU-hours at the measured {budget['cpu_seconds_per_epoch']:.0f} "
            "CPU-seconds per epoch of 60,000 images (one core a run, two runs side by side), more if grids "
            "extend.",
        ]
    return "\n".join(lines)


def estimated_budget(design: Design, cpu_seconds_per_epoch: float) -> dict:
    grid_points = sum(len(g) for _, g in design.lr_grids)
    tune_share = (60000 - 60000 // HELD_OUT_EVERY) / 60000
    epoch_runs = grid_points * design.epochs * tune_share
    epoch_runs += 2 * design.seeds * design.epochs + 2 * design.epochs + design.seeds * design.epochs // 2
    runs = grid_points + 2 * design.seeds + 1 + design.seeds
    return {
        "runs": runs,
        "epoch_runs": round(epoch_runs),
        "cpu_seconds_per_epoch": cpu_seconds_per_epoch,
        "cpu_hours": epoch_runs * cpu_seconds_per_epoch / 3600,
    }


def _fmt(value, spec=".4f") -> str:
    return "—" if value is None else format(value, spec)


def _cpu_minutes(run: dict) -> str:
    minutes = f"{run['cpu_seconds'] / 60:.1f}"
    if run.get("resumed_at_epoch"):
        return f"{minutes} (the attempt after epoch {run['resumed_at_epoch']:g})"
    return minutes


def _met(condition: bool | None) -> str:
    return "not run yet" if condition is None else "yes" if condition else "no"


def _saturation_call(saturated: bool | None, seeds_in: int, seeds: int) -> str:
    if saturated is None:  # the rule's call waits for every seed of the half-epoch runs
        return f"no call before all {seeds} seeds are in ({seeds_in} so far)"
    return "saturated" if saturated else "not saturated"


def results_section(design: Design, report: dict, runs: dict[str, dict], reference: dict | None) -> str:
    s = report["summary"]
    lines = ["## Results", ""]
    if reference:
        lines.append(
            f"Simple reference: logistic regression on the {reference['image_size']} px evaluation pixels, "
            f"C={reference['c']:g} (held-out: "
            + ", ".join(f"C={c}: {v:.4f}" for c, v in reference["held_out_top1_by_c"].items())
            + f"): **{reference['test_top1']:.4f}** test top-1."
        )
        lines.append("")
    lines += ["| cell | grid of peak LRs (held-out top-1 at the end) | picked |", "| --- | --- | --- |"]
    for b, g in report["grids"].items():
        points = ", ".join(f"{lr:g}: {_fmt(g['held_out_top1'].get(f'{lr:g}'))}" for lr in g["grid"]
                           if f"{lr:g}" in g["held_out_top1"])  # fmt: skip
        lines.append(f"| LARS-{b} | {points or 'no run yet'} | {_fmt(g['picked'], 'g')} |")
    lines += [
        "",
        "| run | batch | peak LR | epochs | seed | steps | test top-1 | steps to "
        f"{design.target_top1:g} | CPU-min |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in sorted(runs, key=lambda n: (runs[n]["kind"] != "final", runs[n]["kind"], n)):
        r = runs[name]
        if r["kind"] in ("grid", "budget"):  # the third design's runs are in its own section
            continue
        figure = "diverged" if r["diverged"] else _fmt(r["final_top1"])
        lines.append(
            f"| {name} | {r['batch']} | {r['lr']:g} | {r['epochs']} | {r['seed']} | {r['steps'] or '—'} | {figure} "
            f"| {steps_to_target(r.get('history', []), design.target_top1) or 'not reached'} "
            f"| {_cpu_minutes(r)} |"
        )
    lines += ["", "**Verdict** (computed by the script from the per-seed figures above):", ""]
    if s["delta"] is None:
        lines.append(f"- **{s['verdict']}** so far: not every cell has two or more final seeds yet.")
    else:
        low, high = s["delta_ci90"]
        lines.append(
            f"- Δ = {s['lars_large_top1_mean']:.4f} - {s['baseline_top1_mean']:.4f} = {s['delta'] * 100:+.2f} pt, "
            f"{design.confidence:.0%} interval [{low * 100:+.2f}, {high * 100:+.2f}] pt."
        )
        lines.append(
            f"- **{s['verdict']}**" + ("" if s["complete"] else " (not every planned run is in yet).")
        )
        for name, conditions in s["verdict_conditions"].items():
            state = "; ".join(f"{c}: {_met(met)}" for c, met in conditions.items())
            lines.append(f"  - {name} needs all of: {state}.")
    if s["baseline_half_epochs_top1"] is not None and s["baseline_top1_mean"] is not None:
        gap = (s["baseline_top1_mean"] - s["baseline_half_epochs_top1"]) * 100
        lines.append(
            f"- Saturation: at {design.epochs // 2} epochs the baseline reaches {s['baseline_half_epochs_top1']:.4f}, "
            f"{abs(gap):.2f} pt {'under' if gap >= 0 else 'above'} its {design.epochs}-epoch mean: "
            f"{_saturation_call(s['saturated'], len(s['baseline_half_epochs_top1_each']), design.seeds)} "
            f"(limit {design.saturation_points:g} pt)."
        )
    if s["large_twice_epochs_top1"] is not None and s["baseline_top1_mean"] is not None:
        gap = (s["large_twice_epochs_top1"] - s["baseline_top1_mean"]) * 100
        lines.append(
            f"- LARS-{design.large_batch} at {2 * design.epochs} epochs: {s['large_twice_epochs_top1']:.4f} "
            f"({gap:+.2f} pt against the baseline)."
        )
    if not s["verdict_conditions"]:  # else the refutation's conditions above say it
        lines.append(f"- Every pick inside its grid: {'yes' if s['picks_inside_grids'] else 'no'}.")
    if s["simple_reference_top1"] is not None and s["baseline_top1_mean"] is not None:
        lines.append(
            f"- Baseline against the simple reference: {s['baseline_top1_mean']:.4f} vs "
            f"{s['simple_reference_top1']:.4f} ({(s['baseline_top1_mean'] - s['simple_reference_top1']) * 100:+.1f} pt)."
        )
    lines += ["", f"![top-1 against epochs and steps; steps to {design.target_top1:g} by batch]({PLOT})", ""]
    return "\n".join(lines)


def plot(design: Design, runs: dict[str, dict], path: str) -> None:
    """Top-1 against epochs and optimizer steps (test: finals and checks; held-out: grid runs, faint), and steps
    to target by batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_epoch, by_step, to_target) = plt.subplots(1, 3, figsize=(17, 4.8))
    colors = {design.small_batch: "tab:blue", design.large_batch: "tab:red"}
    styles = {"final": "-", "half": ":", "long": "--"}
    labelled, not_reached = set(), []
    for name in sorted(runs):
        r = runs[name]
        if not r.get("history") or r["kind"] == "budget":  # the third design has its own plot
            continue
        key = (r["kind"], r["batch"])
        label = None if key in labelled else f"{r['kind']} {r['batch']} ({r['epochs']} epochs)"
        labelled.add(key)
        history = r["history"]
        if r["kind"] == "grid":  # held-out top-1 of the tuning runs, one thin line per peak LR
            label = label and f"grid {r['batch']} (held-out, one per peak LR)"
            style = dict(color=colors[r["batch"]], linewidth=0.6, alpha=0.35)
        else:
            style = dict(color=colors[r["batch"]], linestyle=styles[r["kind"]], linewidth=1)
        by_epoch.plot([h["epoch"] for h in history], [h["top1"] for h in history], label=label, **style)
        by_step.plot([h["step"] for h in history], [h["top1"] for h in history], **style)
        steps = steps_to_target(history, design.target_top1)
        if steps is not None and r["kind"] in ("final", "long"):
            to_target.scatter(
                [r["batch"]], [steps], color=colors[r["batch"]], marker="o" if r["kind"] == "final" else "x"
            )
        elif r["kind"] in ("final", "long"):
            not_reached.append(name)
    grid_points = [(r["batch"], steps_to_target(r.get("history", []), design.target_top1)) for r in runs.values()
                   if r["kind"] == "grid"]  # fmt: skip
    grid_points = [(b, s) for b, s in grid_points if s is not None]
    if grid_points:
        to_target.scatter(
            *zip(*grid_points, strict=True), color="grey", marker=".", label="grid runs (held-out)"
        )
    batches = [design.small_batch, design.large_batch]
    first = min((s for s in [steps_to_target(r.get("history", []), design.target_top1) for r in runs.values()
                             if r["kind"] == "final" and r["batch"] == design.small_batch] if s), default=None)  # fmt: skip
    if first:
        to_target.plot(batches, [first, first * design.small_batch / design.large_batch], "k:", linewidth=1,
                       label="perfect scaling")  # fmt: skip
    for axis in (by_epoch, by_step):
        axis.set_ylabel("top-1 (averaged weights; test, grids: held-out)")
        axis.set_ylim(0.7, 0.95)
        axis.grid(alpha=0.3)
    by_epoch.set_xlabel("epoch")
    by_step.set_xlabel("optimizer steps")
    by_step.set_xscale("log")
    to_target.set_xscale("log", base=2)
    to_target.set_yscale("log")
    to_target.set_xlabel("global batch")
    to_target.set_ylabel(f"steps to top-1 {design.target_top1:g}")
    to_target.grid(alpha=0.3)
    if not_reached:  # no point to draw: say so, or the panel reads as if they had not run
        to_target.set_title("never reached (test): " + ", ".join(not_reached), fontsize=8)
    if labelled:
        by_epoch.legend(fontsize=8)
    if grid_points or first:
        to_target.legend(fontsize=8)
    fig.suptitle(
        "LARS at batch 256 and 4096: a line per run (solid: finals; dotted: half epochs; dashed: twice; faint: grids)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- main


MULTIPLIER_PLOT = "large_batch_study_multiplier.png"
# CPU-seconds per epoch of 60,000 images of the third design's runs (new code, one core a run, two side by
# side; 256 and 4096 from the 8-epoch checks of the new code, 1024 between them), measured before its runs
# (docs/status.md); for the budget in its design section.
MULTIPLIER_CPU_SECONDS_PER_EPOCH = {256: 46.0, 1024: 40.0, 4096: 37.0}
multiplier_cost = epoch_multiplier.estimated_cost(
    epoch_multiplier.MULTIPLIER, MULTIPLIER_CPU_SECONDS_PER_EPOCH
)


def report_figures(design: Design, third, runs: dict[str, dict], reference: dict | None) -> dict:
    """The results file's figures: the second design's summary with the third's as ``epoch_multiplier``."""
    report = summarise(design, runs, reference)
    report["summary"]["epoch_multiplier"] = epoch_multiplier.summarise(
        third, runs, lambda batch: steps_per_epoch(runs, batch)
    )
    return report


def steps_per_epoch(runs: dict[str, dict], batch: int) -> float | None:
    """The optimizer steps per epoch of ``batch`` on the finals' split, from a finished run of it."""
    for run in runs.values():
        if run["batch"] == batch and run["kind"] != "grid" and run.get("steps"):
            return run["steps"] / run["epochs"]
    return None


def _check_same_multiplier(results: Results, third: epoch_multiplier.MultiplierDesign) -> None:
    saved = results.saved.get("epoch_multiplier_design")
    current = json.loads(json.dumps(third.to_dict()))
    if saved is not None and saved != current:
        changed = sorted(k for k in saved.keys() | current.keys() if saved.get(k) != current.get(k))
        raise SystemExit(
            f"[study] {results.path} holds the epoch multiplier's runs of another design (differs in "
            f"{', '.join(changed)}); restore the design or start the study with another --out-dir"
        )


def multiplier_runs(third: epoch_multiplier.MultiplierDesign, runs: dict[str, dict]) -> list[Run]:
    """The third design's runs not yet in ``runs`` (any design's run of the same batch, LR, epochs and seed
    counts), the large batch's first: they take longest."""
    wanted = [(third.large_batch, third.large_epochs, seed) for seed in range(third.large_seeds)]
    wanted += [(third.small_batch, e, seed) for e in epoch_multiplier.small_budgets_needed(third, runs)
               for seed in range(third.small_seeds)]  # fmt: skip
    wanted += [(third.middle_batch, third.middle_epochs, seed) for seed in range(third.middle_seeds)]
    have = {
        (r["batch"], r["epochs"], r["seed"])
        for r in runs.values()
        if r["kind"] != "grid" and r["lr"] == third.lr
    }
    return [Run("budget", batch, third.lr, epochs, seed) for batch, epochs, seed in wanted
            if (batch, epochs, seed) not in have]  # fmt: skip


def run_multiplier(third, results: Results, runner: Runner, jobs: int, write, start: float) -> int:
    """Trains the third design's runs until none is missing (a small-batch budget added by the design's
    extension rule once the runs it depends on are in), then prints its summary."""
    while todo := multiplier_runs(third, results.runs):
        say(f"[study] epoch multiplier: {len(todo)} runs to train: {', '.join(r.name for r in todo)}")
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            list(pool.map(runner, todo))
    with results.lock:
        write()
    summary = epoch_multiplier.summarise(third, results.runs, lambda b: steps_per_epoch(results.runs, b))
    print(json.dumps({k: summary[k] for k in ("k", "k_interval", "k_bound", "at_large_epochs", "finding")}))
    say(f"[study] epoch multiplier done in {(time.time() - start) / 60:.0f} min; wrote {results.path}")
    return 0


def superseded_section(path: str) -> str:
    """The 20-epoch study's report, kept below the new one (from the file as committed before this design)."""
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        text = f.read()
    marker = "## Superseded: the 20-epoch study"
    return text[text.index(marker) :] if marker in text else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default="/tmp/effnet-large-batch-study")
    parser.add_argument("--out-dir", default=os.path.join(REPO, "docs"))
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (each takes about one core)")
    parser.add_argument("--cpu-seconds-per-epoch", type=float, default=36.0, help="for the budget estimate")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--design-only", action="store_true", help="write the design section, train nothing")
    what.add_argument("--report-only", action="store_true", help="rewrite the .md/.png from the JSON")
    what.add_argument(
        "--multiplier",
        action="store_true",
        help="train the third design's runs (epoch_multiplier.py), reusing the second design's; needs its runs",
    )
    args = parser.parse_args(argv)

    design, third = DESIGN, epoch_multiplier.MULTIPLIER
    os.makedirs(args.out_dir, exist_ok=True)
    results = Results(os.path.join(args.out_dir, RESULTS), design)
    _check_same_multiplier(results, third)
    report_path = os.path.join(args.out_dir, REPORT)
    superseded = superseded_section(report_path)
    budget = estimated_budget(design, args.cpu_seconds_per_epoch)

    def write() -> None:
        report = report_figures(design, third, results.runs, results.reference)
        everything = {
            **report,
            "design": design.to_dict(),
            "epoch_multiplier_design": third.to_dict(),
            "budget_estimate": budget,
            "reference": results.reference,
            "runs": results.runs,
        }
        with open(results.path + ".tmp", "w") as f:
            json.dump(everything, f, indent=1)
        os.replace(results.path + ".tmp", results.path)
        text = [
            "# Large-batch study (benchmarks/large_batch_study.py)",
            "",
            design_section(design, budget),
            "",
            results_section(design, report, results.runs, results.reference),
            "",
            epoch_multiplier.design_section(third, multiplier_cost),
            "",
            epoch_multiplier.results_section(third, report["summary"]["epoch_multiplier"]),
        ]
        if superseded:
            text += ["", superseded]
        with open(report_path, "w") as f:
            f.write("\n".join(text).rstrip() + "\n")
        if any(r.get("history") for r in results.runs.values()):
            plot(design, results.runs, os.path.join(args.out_dir, PLOT))
            epoch_multiplier.plot(
                third, report["summary"]["epoch_multiplier"], os.path.join(args.out_dir, MULTIPLIER_PLOT)
            )

    if args.design_only or args.report_only:
        write()
        say(f"[study] wrote {report_path}")
        return 0

    start = time.time()
    data = prepare_data(args.work_dir)
    reference_settings = {"image_size": design.image_size, "c_grid": list(REFERENCE_C)}
    if any((results.reference or {}).get(k) != v for k, v in reference_settings.items()):
        say("[study] simple reference: logistic regression on the evaluation pixels")
        results.reference = simple_reference(data, design.image_size)
        say(f"[study] simple reference: test top-1 {results.reference['test_top1']:.4f}")
        with results.lock:
            write()
    runner = Runner(design, data, results, args.work_dir, args.jobs, write)
    if args.multiplier:
        return run_multiplier(third, results, runner, args.jobs, write, start)
    # Both cells' grids side by side; the finals and checks after both picks, in order (seed by seed, so that
    # an interrupted study has both cells at the same depth).
    batches = (design.small_batch, design.large_batch)
    with concurrent.futures.ThreadPoolExecutor(len(batches)) as pool:
        tuned = dict(zip(batches, pool.map(lambda b: tune_cell(design, b, runner), batches), strict=True))
    for batch, (grid, picked) in tuned.items():
        say(f"[study] LARS-{batch}: grid {grid}, picked peak LR {picked:g}")
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(runner, planned_runs(design, {b: picked for b, (_, picked) in tuned.items()})))
    write()
    print(json.dumps(summarise(design, results.runs, results.reference)["summary"], indent=1))
    say(
        f"[study] done in {(time.time() - start) / 60:.0f} min; wrote {results.path} and the .md/.png beside it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
