"""A small-scale Table 2 on real images, tuned as the paper tuned: does LARS keep a 16x batch as accurate?

The paper's claim (Table 2 of Wongpanich et al.): at a batch where RMSProp falls short, LARS with polynomial
decay stays within about a point of the small-batch baseline in the same number of epochs, each optimizer's
learning rate and warmup tuned at its batch. This study measures that on this machine, through the project's
own pipeline, in two phases:

1. **Tuning.** For every cell (optimizer x batch: RMSProp and LARS at ``--small-batch`` 256 and
   ``--large-batch`` 4096, 16x) ``python -m trainer_module tune`` runs a Hyperband search with the same trial
   budget (``--tune-epochs`` 4, factor 3: 10 trials, 26 trained epochs) on a held-out split of the training
   set (50,000 images to train on, 10,000 to evaluate: the test set stays unseen until the finals). Screens
   stop early; the best trials continue from their checkpoints. Tuned: the peak LR per 256 examples and the
   warmup for both optimizers, and for LARS its trust coefficient and the polynomial decay's end LR (the
   settings the reference exposes for it). Epoch settings are tuned as shares of the schedule and applied
   to the finals' longer schedule at the same share.
2. **Finals.** Every cell trains ``--epochs`` (20) epochs on the 60,000 training images at its tuned values,
   with ``--seeds`` seeds (3), and is evaluated on the 10,000 test images in the loop. A cell's figure is the
   top-1 at the end of training (averaged weights, as exported), mean and spread over seeds.

3. **Beside the claim** (``--extra-seeds``, 1 by default, after the claim's cells): rows that are not
   searched, to tell what a cell's figure owes to its search: the paper's untuned values at both batches, and
   at the large batch the small batch's tuned values carried by the linear rule.

Data: Fashion-MNIST (Debian's ``dataset-fashion-mnist``, MIT; installed with apt-get if missing) rendered as
JPEGs under ten real ImageNet synsets, sharded with ``beam_preprocess --classes found`` (labels 0..9, a 10-way
head). Network: the tiny EfficientNet at 16 px on ``--replicas`` (2) logical CPU replicas, batch norm over
128 examples in every row (``model.bn_virtual_batch``, the reference's group size for LARS), weight averaging
0.9999, weight decay 1e-5 and label smoothing 0.1 (the recipe's), RMSProp in the reference's form with its
exponential decay at the paper's share of the budget (0.97 every 2.4 of 350 epochs).

Resumable across machines: after every search and every final run the results are written to
``--out-dir``/large_batch_study.json (with each run's overrides); a later invocation takes every search and
run found there whose settings match and does the rest, so the study can run in the background, be stopped,
and go on in another session from the committed JSON. Searches interrupted half-way resume from their
directory under ``--work-dir`` (while it exists). The report (``.md``, ``.png``) is rewritten after every step
and says which runs are still missing.

    .venv/bin/python benchmarks/large_batch_study.py --work-dir /tmp/study     # everything (many CPU-hours)
    .venv/bin/python benchmarks/large_batch_study.py --tune-only               # phase 1 only
    .venv/bin/python benchmarks/large_batch_study.py --report-only             # the .md/.png from the JSON
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import gzip
import json
import os
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

from beam_preprocess import sample_data  # noqa: E402
from effnet_common import schema  # noqa: E402

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
# Two logical CPU replicas, one per core here: every replica adds per-step work, and with 8 the batch-256
# baseline costs three times as much per image as with 2.
DEFAULT_REPLICAS = 2
# Examples each batch-norm statistic is taken over, every row: the reference's group size for LARS runs.
BN_EXAMPLES = 128
RESULTS = "large_batch_study.json"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """An optimizer with its schedule, its untuned (paper) values and the space its search covers.

    ``space`` holds ``KEY=KIND:LOW:HIGH`` dimensions of ``trainer_module.tuning``; ``{epochs}`` is the search's
    schedule length, ``{peak_low}`` the lowest peak LR of the LR range at the cell's batch.
    """

    optimizer: str
    schedule: str
    lr_per_256: float
    warmup_share: float  # of the schedule, the paper's
    space: tuple[str, ...]
    settings: tuple[str, ...] = ()
    decay_share: float | None = None  # the exponential decay's interval, as a share of the schedule

    def fixed(self, epochs: int) -> list[str]:
        settings = [f"optimizer.name={self.optimizer}", f"schedule.kind={self.schedule}"]
        settings += [
            f"schedule.lr_per_256={self.lr_per_256}",
            f"schedule.warmup_epochs={self.warmup_share * epochs:g}",
        ]
        settings += self.settings
        if self.decay_share is not None:
            settings.append(f"schedule.decay_epochs={self.decay_share * epochs:.6g}")
        return settings

    def search_space(self, epochs: int, batch: int) -> list[str]:
        lowest = min(float(d.split(":")[1]) for d in self.space if d.startswith("schedule.lr_per_256="))
        peak_low = lowest * batch / 256
        return [d.format(epochs=epochs, warmup_high=0.3 * epochs, peak_low=peak_low) for d in self.space]


RECIPES = {
    # The reference's RMSProp (accumulator from 1) with 0.97 decay every 2.4 of 350 epochs: the same share here.
    "rmsprop": Recipe(
        "rmsprop",
        "exponential",
        0.016,
        5 / 350,
        ("schedule.lr_per_256=log:0.0016:0.16", "schedule.warmup_epochs=linear:0:{warmup_high}"),
        ("optimizer.rmsprop_form=tf1",),
        decay_share=2.4 / 350,
    ),
    # LARS + polynomial decay. A kernel's step is LR x trust coefficient x |w| / |g|, batch-norm parameters and
    # biases take the LR alone: both are searched, the LR over 0.1-20 per 256 (the paper's 0.236 was tuned for
    # 350 epochs at 16k+; the 20-epoch demo needs 8), the coefficient a decade either side of the paper's.
    "lars": Recipe(
        "lars",
        "polynomial",
        0.236,
        50 / 350,
        (
            "schedule.lr_per_256=log:0.1:20",
            "schedule.warmup_epochs=linear:0:{warmup_high}",
            "optimizer.lars_eeta=log:0.0001:0.01",
            "schedule.end_lr=log:{peak_low:.3g}e-3:{peak_low:.3g}",
        ),
    ),
}


@dataclasses.dataclass(frozen=True)
class Cell:
    """An optimizer at a batch, and where the values it trains with come from.

    The claim's cells are searched at their own batch. Beside the claim, to tell what a cell's figure owes to
    its search: a ``paper`` row trains with the recipe's untuned values, a transfer row (``tuned_at`` a
    batch) with the values of the same optimizer's search at that batch, scaled by the linear rule.
    """

    optimizer: str
    batch: int
    tuned_at: int | None = None
    paper: bool = False

    @property
    def name(self) -> str:
        base = f"{self.optimizer}-{self.batch}"
        if self.paper:
            return f"{base}-paper"
        return base if self.tuned_at is None else f"{base}-from-{self.tuned_at}"

    @property
    def recipe(self) -> Recipe:
        return RECIPES[self.optimizer]

    @property
    def beside_claim(self) -> bool:
        return self.paper or self.tuned_at is not None

    @property
    def searched(self) -> Cell | None:
        """The cell whose search gives this one its values: itself, the transfer's source, None for paper."""
        if self.paper:
            return None
        return self if self.tuned_at is None else Cell(self.optimizer, self.tuned_at)

    def values(self, search: dict | None) -> dict:
        """The searched values this cell trains with ({} for a paper row: the recipe's settings stand)."""
        if search is None:
            return {}
        ratio = 1 if self.tuned_at is None else self.batch / self.tuned_at
        return transferred(search["best_values"], ratio)


def transferred(values: dict, ratio: float) -> dict:
    """A search's values carried to a batch ``ratio`` times larger by the linear scaling rule.

    The peak LR is searched per 256 examples and warmup as a share of the schedule, so both carry over as they
    are, as does LARS' trust coefficient; the polynomial decay's end LR is absolute, so it is scaled with the
    peak to keep its ratio to it.
    """
    return {k: v * ratio if k == "schedule.end_lr" else v for k, v in values.items()}


def beside_claim_cells(small: int, large: int) -> list[Cell]:
    """The rows beside the claim, most telling first: does the large batch do better with the small batch's
    values, and do the searches beat the paper's untuned values where the untuned study found them strong?"""
    return [
        Cell("lars", large, tuned_at=small),
        Cell("rmsprop", small, paper=True),
        Cell("lars", large, paper=True),
        Cell("rmsprop", large, tuned_at=small),
        Cell("lars", small, paper=True),
        Cell("rmsprop", large, paper=True),
    ]


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


def prepare_data(work_dir: str) -> tuple[dict, dict]:
    """(the tuning split: training set minus every HELD_OUT_EVERY-th image / those images, the finals' split:
    the training set / the test set)."""
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
    final_split = _shard(train, test, work_dir, "final")
    return tune_split, final_split


# ---------------------------------------------------------------------------------------------- settings


def common_overrides(args, data: dict, batch: int) -> list[str]:
    """What every run of the study shares, pinned here so that edits of the demo preset leave it as it is."""
    return [
        "model.variant=tiny",
        "model.precision=float32",
        f"model.image_size={args.image_size}",
        "model.drop_connect_rate=0.2",
        "model.bn_momentum=0.9",  # 0.99 leaves the moving statistics of a short run near their start
        "model.bn_group_size=1",
        f"model.bn_virtual_batch={min(BN_EXAMPLES, batch // args.replicas)}",
        "optimizer.ema_decay=0.9999",
        "optimizer.weight_decay=1e-5",
        "optimizer.label_smoothing=0.1",
        "schedule.end_lr=0.1",  # the reference's; LARS' searches tune it
        f"data.num_train_examples={data['num_train']}",
        f"data.num_eval_examples={data['num_eval']}",
        f"data.global_batch_size={batch}",
        "data.eval_batch_size=1000",
        f"data.num_cores={args.replicas}",
        f"data.replicas_per_host={args.replicas}",
        "data.min_crop_area=0.5",
        "data.random_flip=true",
        "augment.policy=none",
        "loop.eval_every_epochs=1",
        "loop.target_top1=none",
        "loop.strategy=mirrored",
        "loop.deterministic=false",
    ]


def cell_overrides(cell: Cell, args, data: dict, epochs: int) -> list[str]:
    return common_overrides(args, data, cell.batch) + cell.recipe.fixed(epochs)


# ---------------------------------------------------------------------------------------------- runs


class Results:
    """The study's results file: searches and final runs, written after each one (thread-safe)."""

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()
        self.values = {"searches": {}, "runs": {}}
        self.data_sizes = None  # the splits' sizes the saved results were measured on
        self.args = {}  # the study's settings they were measured with
        if os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            self.values["searches"] = saved.get("searches", {})
            self.values["runs"] = saved.get("runs", {})
            self.data_sizes = saved.get("data")
            self.args = saved.get("args", {})

    def get(self, kind: str, name: str, settings: dict) -> dict | None:
        entry = self.values[kind].get(name)
        return entry if entry is not None and entry.get("settings") == settings else None

    def put(self, kind: str, name: str, entry: dict, write) -> None:
        with self.lock:
            self.values[kind][name] = entry
            write(self.values)


def say(line: str) -> None:
    """A line on stdout in one write: searches and runs report from threads side by side."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _run(command: list[str], log_path: str) -> tuple[int, float, float]:
    """(exit code, wall seconds, CPU seconds of the child and its children) of a command logged to a file."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    start = time.time()
    with open(log_path, "a") as log:
        child = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=_child_env())
        _, status, usage = os.wait4(child.pid, 0)
    return os.waitstatus_to_exitcode(status), time.time() - start, usage.ru_utime + usage.ru_stime


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")  # this checkout's code, not another's
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def tune(cell: Cell, args, data: dict, results: Results, write) -> dict:
    """Phase 1 for one cell: its Hyperband search on the tuning split (resumed if half done)."""
    space = cell.recipe.search_space(args.tune_epochs, cell.batch)
    overrides = cell_overrides(cell, args, data, args.tune_epochs)
    settings = {"overrides": overrides, "space": space, "max_epochs": args.tune_epochs, "factor": args.factor}
    saved = results.get("searches", cell.name, settings)
    if saved is not None:
        say(f"[study] {cell.name}: search done before: best {saved['best']['top1']:.4f}")
        return saved
    tune_dir = os.path.join(args.work_dir, "searches", cell.name)
    command = [sys.executable, "-m", "trainer_module", "tune", "--preset", "demo", "--tune-dir", tune_dir]
    command += ["--train-files", data["train"], "--eval-files", data["eval"], "--only", "--seed", "0"]
    command += ["--max-epochs", str(args.tune_epochs), "--factor", str(args.factor)]
    command += ["--cpu-devices", str(args.replicas)]
    for dimension in space:
        command += ["--space", dimension]
    for override in overrides:
        command += ["--set", override]
    say(f"[study] {cell.name}: searching ({' '.join(space)})")
    code, wall, cpu = _run(command, tune_dir + ".log")
    if code:
        raise SystemExit(f"[study] the search of {cell.name} failed (exit {code}); see {tune_dir}.log")
    with open(os.path.join(tune_dir, "trials.json")) as f:
        trials = json.load(f)["trials"]
    with open(os.path.join(tune_dir, "best_hyperparameters.json")) as f:
        best_values = json.load(f)
    best = max((t for t in trials if t["top1"] is not None), key=lambda t: t["top1"])
    entry = {
        "settings": settings,
        "best_values": best_values,
        "best": {"trial_id": best["trial_id"], "top1": best["top1"], "epochs": best["epochs"]},
        "trials": [
            {k: t[k] for k in ("trial_id", "status", "values", "epochs", "top1", "cpu_seconds")}
            for t in trials
        ],
        "cpu_seconds": sum(t["cpu_seconds"] for t in trials),
        "wall_seconds": wall,
        "process_cpu_seconds": cpu,
    }
    results.put("searches", cell.name, entry, write)
    say(
        f"[study] {cell.name}: best held-out top-1 {best['top1']:.4f} of {len(trials)} trials "
        f"({entry['cpu_seconds'] / 60:.0f} CPU-min): {best_values}"
    )
    return entry


def final(cell: Cell, seed: int, args, data: dict, search: dict | None, results: Results, write) -> dict:
    """Phase 2: one seed of a cell at its values, on the training set, evaluated on the test set."""
    from trainer_module import tuning

    values = cell.values(search)
    tuned, _ = tuning.hyperparameter_overrides(values, args.epochs)
    overrides = cell_overrides(cell, args, data, args.epochs) + [f"loop.train_epochs={args.epochs}"]
    overrides += tuned + [f"loop.seed={seed}"]
    name = f"{cell.name}-seed{seed}"
    settings = {"overrides": overrides}
    saved = results.get("runs", name, settings)
    if saved is not None:
        return saved
    model_dir = os.path.join(args.work_dir, "runs", name)
    shutil.rmtree(model_dir, ignore_errors=True)
    command = [sys.executable, "-m", "trainer_module", "--preset", "demo", "--model-dir", model_dir]
    command += [
        "--train-files",
        data["train"],
        "--eval-files",
        data["eval"],
        "--cpu-devices",
        str(args.replicas),
    ]
    for override in [f"name=study-{cell.name}", *overrides]:
        command += ["--set", override]
    say(f"[study] {name}: training {args.epochs} epochs")
    code, wall, cpu = _run(command, model_dir + ".log")
    metrics_path = os.path.join(model_dir, "metrics.json")
    if not os.path.exists(metrics_path):
        raise SystemExit(f"[study] {name} failed (exit {code}); see {model_dir}.log")
    with open(metrics_path) as f:
        metrics = json.load(f)
    history = [
        {k: h[k] for k in ("epoch", "step", "top1", "elapsed_seconds") if k in h} for h in metrics["history"]
    ]
    entry = {
        "settings": settings,
        "cell": cell.name,
        "seed": seed,
        "tuned": values,
        "tuned_at": cell.searched.batch if cell.searched else None,
        "final_top1": history[-1]["top1"],
        "peak_top1": max(h["top1"] for h in history),
        "steps": metrics["steps"],
        "diverged": bool(code) or not np.isfinite(history[-1]["top1"]),
        "history": history,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
    }
    results.put("runs", name, entry, write)
    say(f"[study] {name}: top-1 {entry['final_top1']:.4f} ({cpu / 60:.0f} CPU-min)")
    return entry


# ---------------------------------------------------------------------------------------------- report


def summarise(values: dict, cells: list[Cell], args) -> dict:
    """Per cell: the values it trained with, the finals' top-1 mean and spread; the claim's figures on top.

    The claim is judged on the searched cells (each tuned at its own batch, as the paper did); the rows beside
    it are reported under ``beside_claim``.
    """
    rows = []
    for cell in cells:
        search = values["searches"].get(cell.searched.name) if cell.searched else None
        own = search if not cell.beside_claim else None
        runs = [values["runs"][k] for k in sorted(values["runs"]) if values["runs"][k]["cell"] == cell.name]
        finals = [r["final_top1"] for r in runs]
        rows.append(
            {
                "cell": cell.name,
                "optimizer": cell.optimizer,
                "batch": cell.batch,
                "values_from": "paper" if cell.paper else f"search at {cell.searched.batch}",
                "beside_claim": cell.beside_claim,
                "tuned": cell.values(search) if search or cell.paper else None,
                "held_out_top1": own["best"]["top1"] if own else None,
                "search_cpu_minutes": own["cpu_seconds"] / 60 if own else None,
                "seeds": [r["seed"] for r in runs],
                "final_top1_each": finals,
                "final_top1_mean": float(np.mean(finals)) if finals else None,
                "final_top1_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else None,
                "peak_top1_mean": float(np.mean([r["peak_top1"] for r in runs])) if runs else None,
                "steps": runs[0]["steps"] if runs else None,
                "diverged": sum(r["diverged"] for r in runs),
                "cpu_minutes_per_run": float(np.mean([r["cpu_seconds"] for r in runs])) / 60
                if runs
                else None,
            }
        )
    claim = {(r["optimizer"], r["batch"]): r for r in rows if not r["beside_claim"]}

    def mean(optimizer: str, batch: int) -> float | None:
        return claim.get((optimizer, batch), {}).get("final_top1_mean")

    small, large = args.small_batch, args.large_batch
    baselines = [claim[(o, small)] for o in RECIPES if mean(o, small) is not None]
    baseline = max(baselines, key=lambda r: r["final_top1_mean"]) if baselines else None
    lars, rmsprop = mean("lars", large), mean("rmsprop", large)
    summary = {
        "baseline_top1_mean": baseline["final_top1_mean"] if baseline else None,
        "baseline_cell": baseline["cell"] if baseline else None,
        "lars_large_top1_mean": lars,
        "rmsprop_large_top1_mean": rmsprop,
        "large_batch": large,
        "small_batch": small,
        "seeds": sorted({r["seed"] for r in values["runs"].values()}),
        "complete": all(len(r["final_top1_each"]) >= args.seeds for r in claim.values()),
        "beside_claim": {
            r["cell"]: r["final_top1_mean"]
            for r in rows
            if r["beside_claim"] and r["final_top1_mean"] is not None
        },
    }
    if baseline and lars is not None:
        summary["lars_within_1pt"] = bool(lars >= baseline["final_top1_mean"] - 0.01)
    if baseline and rmsprop is not None:
        summary["rmsprop_3pt_short"] = bool(rmsprop <= baseline["final_top1_mean"] - 0.03)
    return {"summary": summary, "cells": rows}


def _fmt(value, spec=".4f"):
    return "—" if value is None else format(value, spec)


def markdown(report: dict, args, data_sizes: dict) -> str:
    s = report["summary"]
    lines = [
        "# Large-batch study (benchmarks/large_batch_study.py)",
        "",
        f"Fashion-MNIST sharded with `--classes found` (10 classes), tiny EfficientNet at {args.image_size} px on "
        f"{args.replicas} logical CPU replicas, batch norm over {BN_EXAMPLES} examples. Tuning: Hyperband "
        f"(`--tune-epochs {args.tune_epochs}`, factor {args.factor}, seed 0), the same budget for every cell, on "
        f"{data_sizes['tune_train']:,} training images evaluated on {data_sizes['tune_eval']:,} held out from "
        f"the training set. Finals: {args.epochs} epochs on {data_sizes['train']:,} images, top-1 on the "
        f"{data_sizes['eval']:,} test images at the end of training (averaged weights), seeds "
        f"{', '.join(map(str, range(args.seeds)))}."
        + (
            f" Beside the claim (up to {args.extra_seeds} seed(s) each, not searched): `-paper` rows train with the "
            "recipe's untuned values (RMSProp LR 0.016 per 256, warmup 5/350 of the schedule; LARS LR 0.236 "
            "per 256, trust coefficient 0.001, warmup 50/350, end LR 0.1); "
            f"`-from-{args.small_batch}` rows train at {args.large_batch} with the batch-{args.small_batch} "
            "search's values by the linear rule (LR per 256 and warmup share as they are, end LR "
            f"x{args.large_batch // args.small_batch})."
            if args.extra_seeds
            else ""
        ),
        "",
        "| cell | values (epochs: of the search's schedule) | held-out top-1 (search) | search CPU-min | steps | final top-1 mean ± sd "
        "(each seed) | peak top-1 mean | CPU-min per run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["cells"]:
        tuned = ", ".join(
            f"{k.split('.')[-1]}={v:.3g}"
            for k, v in (r["tuned"] or {}).items()
            if not k.startswith("tuning/")
        )
        each = ", ".join(f"{x:.4f}" for x in r["final_top1_each"])
        spread = f" ± {r['final_top1_std']:.4f}" if r["final_top1_std"] is not None else ""
        if not tuned:
            tuned = "the paper's" if r["values_from"] == "paper" else "not tuned yet"
        lines.append(
            f"| {r['cell']} | {tuned} | {_fmt(r['held_out_top1'])} "
            f"| {_fmt(r['search_cpu_minutes'], '.0f')} | {r['steps'] or '—'} "
            f"| {_fmt(r['final_top1_mean'])}{spread} ({each or 'no run yet'}) | {_fmt(r['peak_top1_mean'])} "
            f"| {_fmt(r['cpu_minutes_per_run'], '.1f')} |"
        )
    lines += ["", "**The paper's claim at this scale** (means over seeds):", ""]
    if s["baseline_top1_mean"] is None:
        lines.append("- no batch-256 cell has a final run yet.")
    else:
        lines.append(
            f"- best batch-{args.small_batch} baseline: {s['baseline_cell']}, {s['baseline_top1_mean']:.4f}."
        )
        for key, name, claim, flag in (
            ("lars_large_top1_mean", "LARS", "within 1.0 point", "lars_within_1pt"),
            ("rmsprop_large_top1_mean", "RMSProp", "at least 3 points short", "rmsprop_3pt_short"),
        ):
            if s[key] is None:
                lines.append(f"- {name} at {args.large_batch}: no final run yet.")
            else:
                delta = (s[key] - s["baseline_top1_mean"]) * 100
                verdict = "holds" if s[flag] else "does not hold"
                lines.append(
                    f"- {name} at {args.large_batch}: {s[key]:.4f} ({delta:+.2f} pt); the claim ({claim}) {verdict}."
                )
        for name, top1 in s["beside_claim"].items():
            lines.append(
                f"- beside the claim, {name}: {top1:.4f} ({(top1 - s['baseline_top1_mean']) * 100:+.2f} pt)."
            )
    if not s["complete"]:
        lines += [
            "",
            f"Incomplete: not every cell has {args.seeds} seeds yet (`--seeds {args.seeds}` resumes).",
        ]
    lines += ["", "![top-1 against epochs and steps](large_batch_study.png)", ""]
    return "\n".join(lines)


def plot(values: dict, path: str) -> None:
    """Top-1 on the test set against epochs and against optimizer steps, one line per final run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_epoch, by_step) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = {}
    for name in sorted(values["runs"]):
        run = values["runs"][name]
        history = run["history"]
        label = run["cell"] if run["cell"] not in colors else None
        style = ":" if run["cell"].endswith("-paper") else "--" if "-from-" in run["cell"] else "-"
        (line,) = by_epoch.plot(
            [h["epoch"] for h in history], [h["top1"] for h in history], style, marker="o", markersize=2,
            label=label, color=colors.get(run["cell"]),
        )  # fmt: skip
        colors.setdefault(run["cell"], line.get_color())
        by_step.plot(
            [h["step"] for h in history], [h["top1"] for h in history], style, color=colors[run["cell"]]
        )
    by_epoch.set_xlabel("epoch")
    by_step.set_xlabel("optimizer steps")
    by_step.set_xscale("log")
    for axis in (by_epoch, by_step):
        axis.set_ylabel("top-1 (Fashion-MNIST test set, averaged weights)")
        axis.set_ylim(0.5, 1.0)
        axis.grid(alpha=0.3)
    by_epoch.legend(fontsize=8)
    fig.suptitle(
        "Large-batch study: a line per seed, a colour per cell "
        "(solid: searched at its batch; dashed: batch-256 values; dotted: the paper's)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default="/tmp/effnet-large-batch-study")
    parser.add_argument("--out-dir", default=os.path.join(REPO, "docs"))
    parser.add_argument("--epochs", type=int, default=20, help="the finals' epochs")
    parser.add_argument(
        "--tune-epochs", type=int, default=4, help="every trial's schedule; Hyperband's longest"
    )
    parser.add_argument("--factor", type=int, default=3, help="Hyperband's reduction factor")
    parser.add_argument("--small-batch", type=int, default=256)
    parser.add_argument("--large-batch", type=int, default=4096)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=DEFAULT_REPLICAS, help="logical CPU replicas")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2, help="searches or runs side by side (each ~one core)")
    parser.add_argument("--tune-only", action="store_true", help="phase 1 only")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the .md and .png from the saved JSON, train nothing",
    )
    parser.add_argument(
        "--extra-seeds",
        type=int,
        default=1,
        help="seeds of each row beside the claim (paper values, transfers); 0: none",
    )
    args = parser.parse_args(argv)
    if args.large_batch % args.small_batch or args.large_batch <= args.small_batch:
        parser.error("--large-batch must be a multiple of --small-batch above it")

    results = Results(os.path.join(args.out_dir, RESULTS))
    if args.report_only:
        if results.data_sizes is None:
            parser.error(f"--report-only: no results in {results.path}")
        sizes = results.data_sizes
        # The report describes the study the results came from: its settings, not this command's defaults.
        kept = ("work_dir", "out_dir", "report_only", "jobs")
        vars(args).update({k: v for k, v in results.args.items() if k not in kept})
    else:
        tune_data, final_data = prepare_data(args.work_dir)
        sizes = {
            "tune_train": tune_data["num_train"],
            "tune_eval": tune_data["num_eval"],
            "train": final_data["num_train"],
            "eval": final_data["num_eval"],
        }
    os.makedirs(args.out_dir, exist_ok=True)
    cells = [Cell(o, b) for b in (args.small_batch, args.large_batch) for o in RECIPES]
    extras = beside_claim_cells(args.small_batch, args.large_batch) if args.extra_seeds else []

    def write(values: dict) -> None:
        report = summarise(values, cells + extras, args)
        # The settings the results were measured with: a report-only pass keeps those it found.
        recorded = results.args if args.report_only else vars(args)
        everything = {**report, "args": recorded, "data": sizes, **values}
        with open(results.path + ".tmp", "w") as f:
            json.dump(everything, f, indent=1)
        os.replace(results.path + ".tmp", results.path)
        with open(os.path.join(args.out_dir, "large_batch_study.md"), "w") as f:
            f.write(markdown(report, args, sizes))
        if values["runs"]:
            plot(values, os.path.join(args.out_dir, "large_batch_study.png"))

    if args.report_only:
        write(results.values)
        say(f"[study] rewrote the report beside {results.path}")
        return 0
    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        searches = dict(
            zip(cells, pool.map(lambda c: tune(c, args, tune_data, results, write), cells), strict=True)
        )
        if not args.tune_only:
            # Seed by seed over the cells, so that an interrupted study has every cell at the same depth; the
            # claim's cells first, then the rows beside it.
            tasks = [(cell, seed) for seed in range(args.seeds) for cell in cells]
            tasks += [(cell, seed) for seed in range(args.extra_seeds) for cell in extras]

            def run(task: tuple[Cell, int]) -> dict:
                cell, seed = task
                search = searches[cell.searched] if cell.searched else None
                return final(cell, seed, args, final_data, search, results, write)

            list(pool.map(run, tasks))
    write(results.values)
    report = summarise(results.values, cells + extras, args)
    print(json.dumps(report["summary"], indent=1))
    print(
        f"[study] done in {(time.time() - start) / 60:.0f} min; wrote {results.path} and the .md/.png beside it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
