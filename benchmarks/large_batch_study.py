"""A small-scale Table 2 on real images: does LARS keep a large batch as accurate as the small-batch baseline?

The paper's claim (Table 2 and Figure 1 of Wongpanich et al.): at a batch where RMSProp falls behind, LARS with
polynomial decay stays within about a point of the small-batch RMSProp baseline, in the same epoch budget.
This study measures that on this machine, through the project's own pipeline:

1. Fashion-MNIST (60,000 training and 10,000 test photos of clothing, MIT licence, Debian's
   ``dataset-fashion-mnist``; installed with apt-get if missing) is rendered as JPEGs under ten real ImageNet
   synsets: the training set as an ILSVRC2012-style archive of per-synset tars, the test set as the extracted
   ``val/<wnid>/`` layout (the official validation names allow only 50 images per synset).
2. ``beam_preprocess`` shards both (16 training and 8 validation shards).
3. ``python -m trainer_module`` trains each row on ``--replicas`` logical CPU replicas (MirroredStrategy, 2 by
   default) with synchronised batch norm, weight averaging on, the same epoch budget for every row, the LR by
   the per-256 rule with warmup, and evaluates the 10,000 test images in the loop.

Rows (optimizer, global batch, LR per 256 examples; ``ROWS``): RMSProp 256 (the baseline), then RMSProp and
LARS + polynomial decay at larger batches, LARS at up to 8192; ``rmsprop-keras-4096`` is the large RMSProp row
with Keras' accumulator start. RMSProp is the reference's (``optimizer.rmsprop_form=tf1``). The LR follows the
per-256 rule from the paper's values (0.016 for RMSProp, 0.236 for LARS, its 16384-batch row); warmup is the
paper's share of the budget (5 of 350 epochs for RMSProp, 50 of 350 for LARS). Two settings follow the demo
rather than ImageNet: batch-norm momentum 0.9 (0.99 leaves the moving statistics of a 150-step run a quarter on
their initial values) and the tiny network at a small resolution.

Beside them, rows that check one cause each of LARS' shortfall at 4096 (``lars-4096-bn128``: batch norm over
128 examples as in the reference, ``lars-4096-end0.025``: the paper's end/peak LR ratio, ``lars-4096-lr0.118``:
half the LR) and ``lars-256``, LARS at the baseline's batch and steps, which tells an effect of the batch size
from one of the optimizer.

The budget is in epochs, as in the paper: 20 epochs of 60,000 images are 4,687 steps at batch 256, 585 at 2048
and 292 at 4096 (the paper's B5 at 65536 takes 6,842). Runs train two at a time (``--jobs 2``): a run keeps
about one core busy, and two 20-epoch rows side by side took 22-26 minutes here, so the four default rows
(baseline, RMSProp 4096, LARS 2048 and 4096, one seed each) take about 50 minutes on two quiet cores; the
check rows and ``lars-8192`` (146 steps, for comparison with earlier studies) run on request (``--rows``).
Each row reports its own CPU time, so the cost on a quiet machine can be told from the wall time on a shared
one.

Output: a Table-2-style table (markdown, printed and written to ``docs/large_batch_study.md``) and a
Figure-1-style plot (top-1 against epochs, training time and steps, one line per run) in
``docs/large_batch_study.png``; the raw histories in ``docs/large_batch_study.json``.

    .venv/bin/python benchmarks/large_batch_study.py                 # the default rows (about an hour, 2 cores)
    .venv/bin/python benchmarks/large_batch_study.py --epochs 2 --rows rmsprop-256   # a quick look
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
import time

import numpy as np
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from beam_preprocess import sample_data, schema  # noqa: E402

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
# The study's rows run on this many logical CPU replicas (MirroredStrategy). Two, one per core here: every
# replica adds per-step work (its own copy of each op, one more hop in every all-reduce), and with 8 the
# batch-256 baseline costs three times as much per image as with 2, which left no budget for epochs.
DEFAULT_REPLICAS = 2
# Written into a run's model directory when it finishes: its overrides and metrics, for --reuse.
STUDY_FILE = "study_run.json"


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the study: a recipe at a batch size.

    ``rmsprop_form`` is the trainer's ``optimizer.rmsprop_form``: 'tf1' (the reference's
    ``tf.compat.v1.train.RMSPropOptimizer``, accumulator from 1) for the study's RMSProp rows, 'keras'
    (accumulator from 0) for the comparison row that shows what the Keras form does at a large batch.
    """

    optimizer: str
    batch: int
    lr_per_256: float
    rmsprop_form: str = "tf1"
    # A check of one cause: overrides that replace the row's own, the name's suffix, and what the table says.
    changes: tuple[tuple[str, str], ...] = ()
    tag: str = ""
    note: str = ""

    @property
    def name(self) -> str:
        if self.optimizer == "rmsprop" and self.rmsprop_form != "tf1":
            base = f"rmsprop-{self.rmsprop_form}-{self.batch}"
        else:
            base = f"{self.optimizer}-{self.batch}"
        return f"{base}-{self.tag}" if self.tag else base

    @property
    def label(self) -> str:
        if self.optimizer == "rmsprop":
            label = f"rmsprop ({self.rmsprop_form}) + exponential"
        else:
            label = "lars + polynomial"
        return f"{label}, {self.note}" if self.note else label

    @property
    def schedule(self) -> str:
        return "polynomial" if self.optimizer == "lars" else "exponential"

    def warmup_epochs(self, epochs: int) -> float:
        """The paper's share of the budget: 5 of 350 epochs for RMSProp, 50 of 350 for LARS."""
        return epochs * (50.0 if self.optimizer == "lars" else 5.0) / 350.0


# The small-batch baseline, then each larger batch with RMSProp and LARS (the table's order).
ROWS = (
    Row("rmsprop", 256, 0.016),
    Row("rmsprop", 1024, 0.016),
    Row("lars", 1024, 0.236),
    Row("rmsprop", 2048, 0.016),
    Row("lars", 2048, 0.236),
    Row("rmsprop", 4096, 0.016),
    Row("rmsprop", 4096, 0.016, rmsprop_form="keras"),
    Row("lars", 4096, 0.236),
    Row("lars", 8192, 0.236),
    # Why LARS at 4096 trails the baseline, one cause at a time. On 2 replicas a replica holds 2048 examples
    # where the reference's batch-norm groups hold about 128 (per-core batches of 32-64 in groups), and the
    # paper's end LR of 0.1 is 1/150 of its LARS peaks (about 15) but 1/38 of the 3.8 here.
    Row("lars", 4096, 0.236, changes=(("model.bn_virtual_batch", "128"),), tag="bn128", note="BN over 128"),
    Row("lars", 4096, 0.236, changes=(("schedule.end_lr", "0.025"),), tag="end0.025", note="end LR 0.025"),
    Row("lars", 4096, 0.118, tag="lr0.118", note="half the LR"),
    # LARS at the baseline's batch and steps: tells a large-batch effect from one of the optimizer.
    Row("lars", 256, 0.236),
)
DEFAULT_ROWS = ("rmsprop-256", "lars-2048", "rmsprop-4096", "lars-4096")
DEFAULT_EPOCHS = 20


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


def render(fashion_dir: str, out: str) -> tuple[str, str, int, int]:
    """The training archive (ILSVRC-style tar of per-synset tars) and the val/<wnid>/ directory."""
    train_images = read_idx(os.path.join(fashion_dir, "train-images-idx3-ubyte.gz"))
    train_labels = read_idx(os.path.join(fashion_dir, "train-labels-idx1-ubyte.gz"))
    test_images = read_idx(os.path.join(fashion_dir, "t10k-images-idx3-ubyte.gz"))
    test_labels = read_idx(os.path.join(fashion_dir, "t10k-labels-idx1-ubyte.gz"))
    known = set(schema.synsets())
    assert all(s in known for s in FASHION_SYNSETS), "every study synset is an ImageNet synset"

    os.makedirs(out, exist_ok=True)
    train_archive = os.path.join(out, sample_data.TRAIN_ARCHIVE)
    with tarfile.open(train_archive, "w", format=tarfile.USTAR_FORMAT) as outer:
        for label, synset in enumerate(FASHION_SYNSETS):
            members = [
                (f"{synset}_{k + 1}.JPEG", _jpeg(image))
                for k, image in enumerate(train_images[train_labels == label])
            ]
            sample_data._add(outer, f"{synset}.tar", sample_data._tar_bytes(members))
    val_dir = os.path.join(out, "val")
    for label, synset in enumerate(FASHION_SYNSETS):
        os.makedirs(os.path.join(val_dir, synset), exist_ok=True)
        for k, image in enumerate(test_images[test_labels == label]):
            with open(os.path.join(val_dir, synset, f"{synset}_val_{k + 1}.JPEG"), "wb") as f:
                f.write(_jpeg(image))
    return train_archive, val_dir, len(train_labels), len(test_labels)


def prepare_shards(work_dir: str) -> dict:
    """Renders and shards Fashion-MNIST once; a second call reuses the shards (their manifest)."""
    shards = os.path.join(work_dir, "shards")
    manifest_path = os.path.join(shards, "manifest.json")
    if not os.path.exists(manifest_path):
        from beam_preprocess.config import ShardingConfig
        from beam_preprocess.run import run as shard

        start = time.time()
        train_archive, val_dir, _, _ = render(ensure_fashion_mnist(), os.path.join(work_dir, "raw"))
        print(f"[study] rendered Fashion-MNIST as JPEGs in {time.time() - start:.0f}s", flush=True)
        start = time.time()
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
        shutil.rmtree(os.path.join(work_dir, "raw"))
        print(f"[study] sharded with beam_preprocess in {time.time() - start:.0f}s", flush=True)
    with open(manifest_path) as f:
        splits = json.load(f)["splits"]
    return {
        "train": os.path.join(shards, schema.TRAIN, f"{schema.TRAIN}-*"),
        "eval": os.path.join(shards, schema.VALIDATION, f"{schema.VALIDATION}-*"),
        "num_train": splits[schema.TRAIN]["records"],
        "num_eval": splits[schema.VALIDATION]["records"],
    }


# ---------------------------------------------------------------------------------------------- rows


def row_overrides(row: Row, data: dict, args, seed: int) -> list[str]:
    """The row's config as overrides of the demo preset: every setting the study depends on is pinned here,
    so that edits of the demo (a CPU showcase) leave the study as it is."""
    overrides = [
        f"name=study-{row.name}",
        "model.variant=tiny",
        "model.precision=float32",
        f"model.image_size={args.image_size}",
        "model.drop_connect_rate=0.2",
        "model.bn_momentum=0.9",
        "model.bn_group_size=none",
        "model.bn_group_rule=examples128",
        f"optimizer.name={row.optimizer}",
        "optimizer.ema_decay=0.9999",
        "optimizer.weight_decay=1e-5",
        "optimizer.label_smoothing=0.1",
        f"schedule.kind={row.schedule}",
        f"schedule.lr_per_256={row.lr_per_256}",
        f"schedule.warmup_epochs={row.warmup_epochs(args.epochs)}",
        "schedule.end_lr=0.1",
        f"data.num_train_examples={data['num_train']}",
        f"data.num_eval_examples={data['num_eval']}",
        f"data.global_batch_size={row.batch}",
        "data.eval_batch_size=1024",
        f"data.num_cores={args.replicas}",
        f"data.replicas_per_host={args.replicas}",
        "data.min_crop_area=0.5",
        "data.random_flip=true",
        "augment.policy=none",
        f"loop.train_epochs={args.epochs}",
        "loop.eval_every_epochs=1",
        "loop.target_top1=none",
        "loop.strategy=mirrored",
        f"loop.seed={seed}",
        "loop.deterministic=false",
    ]
    if row.optimizer == "rmsprop":
        overrides.append(f"optimizer.rmsprop_form={row.rmsprop_form}")
    changed = dict(row.changes)
    return [o for o in overrides if o.split("=")[0] not in changed] + [f"{k}={v}" for k, v in row.changes]


def _last_train_loss(model_dir: str) -> float:
    """The training loss of the run's last training call (its run log's last progress event).

    The loss of the training batches as trained on: augmented, in training mode, label-smoothed, with the L2
    term for RMSProp (LARS decays inside the update); beside the test top-1 it tells a row that cannot fit
    the training set from one that fits it and generalises worse.
    """
    with open(os.path.join(model_dir, "run_log.jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    return [e for e in events if e["event"] == "progress"][-1]["loss"]


def _training_overrides(overrides: list[str]) -> list[str]:
    """The overrides that change the training: all but the run's name."""
    return [o for o in overrides if not o.startswith("name=")]


def train_row(row: Row, data: dict, args, seed: int) -> dict:
    """Trains one row with ``python -m trainer_module`` on ``--replicas`` logical CPUs; returns its metrics.

    Besides metrics.json's figures, the result holds the run's wall and CPU seconds and the load average
    before and after it: on a shared machine the CPU seconds, not the wall time, say what a quiet one needs.
    With ``--reuse``, a finished run of the same row and seed with the same overrides (the run's name aside) in
    the work directory is taken as it is (a study interrupted after some rows goes on with the rest).
    """
    model_dir = os.path.join(args.work_dir, "runs", f"{row.name}-seed{seed}")
    overrides = row_overrides(row, data, args, seed)
    study_path = os.path.join(model_dir, STUDY_FILE)
    if args.reuse and os.path.exists(study_path):
        with open(study_path) as f:
            saved = json.load(f)
        if _training_overrides(saved["overrides"]) == _training_overrides(overrides):
            print(f"[study] {row.name} seed {seed}: reusing the finished run in {model_dir}", flush=True)
            return {**saved["metrics"], "final_train_loss": _last_train_loss(model_dir)}
    shutil.rmtree(model_dir, ignore_errors=True)
    command = [sys.executable, "-m", "trainer_module", "--preset", "demo", "--model-dir", model_dir]
    command += ["--train-files", data["train"], "--eval-files", data["eval"]]
    command += ["--cpu-devices", str(args.replicas)]
    for override in overrides:
        command += ["--set", override]
    log_path = model_dir + ".log"
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    load_before, start = os.getloadavg()[1], time.time()
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        # This child's own CPU time (rows may run side by side, so not RUSAGE_CHILDREN's running total).
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"[study] {row.name} failed (exit {child.returncode}); see {log_path}")
    with open(os.path.join(model_dir, "metrics.json")) as f:
        metrics = json.load(f)
    metrics["wall_seconds"] = time.time() - start
    metrics["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    metrics["load_average_5min"] = [load_before, os.getloadavg()[1]]
    metrics["final_train_loss"] = _last_train_loss(model_dir)
    with open(study_path, "w") as f:
        json.dump({"overrides": overrides, "metrics": metrics}, f)
    return metrics


# ---------------------------------------------------------------------------------------------- report


def summarise(row: Row, runs: list[dict], epochs: int) -> dict:
    """Peak top-1 and when it was reached, averaged over seeds (as the paper averages three runs)."""
    peaks = [max(run["history"], key=lambda h: h["top1"]) for run in runs]
    return {
        "row": row.name,
        "label": row.label,
        "optimizer": row.optimizer,
        "rmsprop_form": row.rmsprop_form if row.optimizer == "rmsprop" else None,
        "schedule": row.schedule,
        "batch": row.batch,
        "lr_per_256": row.lr_per_256,
        "warmup_epochs": row.warmup_epochs(epochs),
        "peak_top1": float(np.mean([p["top1"] for p in peaks])),
        "peak_top1_each": [p["top1"] for p in peaks],
        "final_top1_each": [run["history"][-1]["top1"] for run in runs],
        "final_train_loss": float(np.mean([run["final_train_loss"] for run in runs])),
        "epochs_to_peak": float(np.mean([p["epoch"] for p in peaks])),
        "seconds_to_peak": float(np.mean([p["elapsed_seconds"] for p in peaks])),
        "first_call_seconds": float(np.mean([run["first_call_seconds"] for run in runs])),
        "images_per_second": float(np.mean([run["images_per_second"] or 0.0 for run in runs])),
        "cpu_seconds": float(np.mean([run.get("cpu_seconds", float("nan")) for run in runs])),
        "wall_seconds": float(np.mean([run.get("wall_seconds", float("nan")) for run in runs])),
        "load_average_5min": [run.get("load_average_5min") for run in runs],
        "steps": runs[0]["steps"],
    }


def table(summaries: list[dict], baseline: dict) -> str:
    lines = [
        "| optimizer | batch | LR per 256 | warmup (epochs) | steps | peak top-1 (each seed) | vs baseline "
        "| epochs to peak | time to peak (s) | images/s | CPU time (min) | last train loss |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summaries:
        delta = (s["peak_top1"] - baseline["peak_top1"]) * 100
        each = ", ".join(f"{top1:.4f}" for top1 in s["peak_top1_each"])
        lines.append(
            f"| {s['label']} | {s['batch']} | {s['lr_per_256']} | {s['warmup_epochs']:.2f} | {s['steps']} "
            f"| {s['peak_top1']:.4f} ({each}) | {delta:+.2f} pt | {s['epochs_to_peak']:.1f} "
            f"| {s['seconds_to_peak']:.0f} | {s['images_per_second']:.0f} | {s['cpu_seconds'] / 60:.1f} "
            f"| {s['final_train_loss']:.3f} |"
        )
    return "\n".join(lines)


def plot(histories: dict[str, list[list[dict]]], path: str) -> None:
    """Figure 1 of the paper at small scale: top-1 against epochs and against time, one line per row.

    A third panel puts the rows against optimizer steps (log scale): at the same epochs a large batch takes
    16-32 times fewer steps, which is what this scale is short of.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_epoch, by_time, by_step) = plt.subplots(1, 3, figsize=(17, 4.8))
    for name, runs in histories.items():
        color = None
        for i, history in enumerate(runs):
            label = name if i == 0 else None
            top1 = [h["top1"] for h in history]
            (line,) = by_epoch.plot(
                [h["epoch"] for h in history], top1, marker="o", markersize=3, label=label, color=color
            )
            color = line.get_color()
            minutes = [h["elapsed_seconds"] / 60 for h in history]
            by_time.plot(minutes, top1, marker="o", markersize=3, color=color, label=label)
            by_step.plot(
                [h["step"] for h in history], top1, marker="o", markersize=3, color=color, label=label
            )
    by_epoch.set_xlabel("epoch")
    by_time.set_xlabel("minutes since the train-and-eval loop started (shared 2-core machine)")
    by_step.set_xlabel("optimizer steps")
    by_step.set_xscale("log")
    for axis in (by_epoch, by_time, by_step):
        axis.set_ylabel("top-1 (Fashion-MNIST test set, averaged weights)")
        axis.set_ylim(0.0, 1.0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(
        "Large-batch study: top-1 against epochs, time and steps (tiny EfficientNet, one line per run)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default="/tmp/effnet-large-batch-study")
    parser.add_argument("--out-dir", default=os.path.join(REPO, "docs"))
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=DEFAULT_REPLICAS, help="logical CPU replicas")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="runs trained side by side (2: each keeps about one core busy, the two cores stay full)",
    )
    parser.add_argument(
        "--rows",
        default=",".join(DEFAULT_ROWS),
        help=f"comma-separated row names, trained in this order (known: {', '.join(r.name for r in ROWS)})",
    )
    parser.add_argument("--reuse", action="store_true", help="take finished rows from --work-dir as they are")
    parser.add_argument("--note", default="", help="a sentence for the results' header (how the rows ran)")
    args = parser.parse_args(argv)
    wanted = args.rows.split(",")
    by_name = {r.name: r for r in ROWS}
    rows = [by_name[name] for name in wanted if name in by_name]
    if len(rows) != len(wanted):
        parser.error(f"--rows: known rows are {', '.join(r.name for r in ROWS)}")

    data = prepare_shards(args.work_dir)
    print(f"[study] {data['num_train']} training / {data['num_eval']} test images", flush=True)

    def run(task: tuple[Row, int]) -> dict:
        row, seed = task
        metrics = train_row(row, data, args, seed)
        peak = max(h["top1"] for h in metrics["history"])
        rate = metrics["images_per_second"] or 0.0  # None when the run had a single (compiling) call
        print(
            f"[study] {row.name} seed {seed}: peak top-1 {peak:.4f} in {metrics['wall_seconds']:.0f}s wall, "
            f"{metrics['cpu_seconds']:.0f}s CPU ({rate:.0f} img/s, first call "
            f"{metrics['first_call_seconds']:.0f}s)",
            flush=True,
        )
        return metrics

    tasks = [(row, seed) for row in rows for seed in range(args.seeds)]
    study_start = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(zip(tasks, pool.map(run, tasks), strict=True))
    study_minutes = (time.time() - study_start) / 60
    histories, summaries = {}, []
    for row in rows:
        runs = [results[(row, seed)] for seed in range(args.seeds)]
        histories[row.name] = [run["history"] for run in runs]
        summaries.append(summarise(row, runs, args.epochs))

    order = [r.name for r in ROWS]
    summaries.sort(key=lambda s: order.index(s["row"]))  # the table in the paper's order
    baseline = summaries[0]
    text = table(summaries, baseline)
    cpu_minutes = sum(s["cpu_seconds"] * args.seeds for s in summaries) / 60
    wall_minutes = sum(s["wall_seconds"] * args.seeds for s in summaries) / 60
    header = (
        f"Fashion-MNIST ({data['num_train']} train / {data['num_eval']} test), tiny EfficientNet at "
        f"{args.image_size} px, {args.epochs} epochs, {args.replicas} logical CPU replicas, {args.seeds} "
        f"seed(s) per row; the runs took {cpu_minutes:.0f} CPU-minutes ({wall_minutes:.0f} min of wall time summed "
        f"over runs, trained up to {args.jobs} at a time); this invocation took {study_minutes:.0f} min."
    )
    if args.note:
        header += " " + args.note
    print(header + "\n\n" + text)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "large_batch_study.md"), "w") as f:
        f.write(f"# Large-batch study (benchmarks/large_batch_study.py)\n\n{header}\n\n{text}\n")
        f.write("\n![top-1 against epochs, time and steps](large_batch_study.png)\n")
    with open(os.path.join(args.out_dir, "large_batch_study.json"), "w") as f:
        json.dump({"args": vars(args), "summaries": summaries, "histories": histories}, f, indent=1)
    plot(histories, os.path.join(args.out_dir, "large_batch_study.png"))
    print(f"[study] wrote {os.path.join(args.out_dir, 'large_batch_study.md')} and .png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
