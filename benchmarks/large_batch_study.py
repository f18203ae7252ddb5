"""A small-scale Table 2 on real images: does LARS keep a large batch as accurate as the small-batch baseline?

The paper's claim (Table 2 and Figure 1 of Wongpanich et al.): at a batch where RMSProp falls behind, LARS with
polynomial decay stays within about a point of the small-batch RMSProp baseline, in the same epoch budget.
This study measures that on this machine, through the project's own pipeline:

1. Fashion-MNIST (60,000 training and 10,000 test photos of clothing, MIT licence, Debian's
   ``dataset-fashion-mnist``; installed with apt-get if missing) is rendered as JPEGs under ten real ImageNet
   synsets: the training set as an ILSVRC2012-style archive of per-synset tars, the test set as the extracted
   ``val/<wnid>/`` layout (the official validation names allow only 50 images per synset).
2. ``beam_preprocess`` shards both (16 training and 8 validation shards).
3. ``python -m trainer_module`` trains each row on 8 logical CPU replicas (MirroredStrategy) with grouped
   synchronised batch norm, weight averaging on, the same epoch budget for every row, the LR by the per-256
   rule with warmup, and evaluates the 10,000 test images in the loop.

Rows (optimizer, global batch, LR per 256 examples): RMSProp 256 (the baseline), RMSProp at the large batch,
LARS + polynomial decay at the same large batch, LARS at the largest batch. Warmup is the paper's share of
the budget (5 of 350 epochs for RMSProp, 50 of 350 for LARS). Step counts here are 20-50x smaller than the
paper's, so two settings follow the demo rather than ImageNet: batch-norm momentum 0.9 (0.99 leaves the moving
statistics of a 150-step run a quarter on their initial values) and the tiny network at a small resolution.

Output: a Table-2-style table (markdown, printed and written to ``docs/large_batch_study.md``) and a
Figure-1-style plot (top-1 against epochs and against training time, one line per row) in
``docs/large_batch_study.png``; the raw histories in ``docs/large_batch_study.json``.

    .venv/bin/python benchmarks/large_batch_study.py                 # the whole study (about 60 minutes here)
    .venv/bin/python benchmarks/large_batch_study.py --epochs 2 --rows rmsprop-256   # a quick look
"""

from __future__ import annotations

import argparse
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
NUM_CORES = 8


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the study: a recipe at a batch size."""

    optimizer: str
    batch: int
    lr_per_256: float

    @property
    def name(self) -> str:
        return f"{self.optimizer}-{self.batch}"

    @property
    def schedule(self) -> str:
        return "polynomial" if self.optimizer == "lars" else "exponential"

    def warmup_epochs(self, epochs: int) -> float:
        """The paper's share of the budget: 5 of 350 epochs for RMSProp, 50 of 350 for LARS."""
        return epochs * (50.0 if self.optimizer == "lars" else 5.0) / 350.0


ROWS = (
    Row("rmsprop", 256, 0.016),
    Row("rmsprop", 4096, 0.016),
    Row("lars", 4096, 0.236),
    Row("lars", 8192, 0.236),
)


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


def row_overrides(row: Row, data: dict, epochs: int, image_size: int, seed: int) -> list[str]:
    """The row's config as overrides of the demo preset (tiny network, one evaluation per epoch)."""
    return [
        f"name=study-{row.name}",
        f"model.image_size={image_size}",
        "model.bn_momentum=0.9",
        "model.bn_group_size=none",
        "model.bn_group_rule=examples128",
        f"optimizer.name={row.optimizer}",
        "optimizer.ema_decay=0.9999",
        "optimizer.weight_decay=1e-5",
        "optimizer.label_smoothing=0.1",
        f"schedule.kind={row.schedule}",
        f"schedule.lr_per_256={row.lr_per_256}",
        f"schedule.warmup_epochs={row.warmup_epochs(epochs)}",
        "schedule.end_lr=0.1",
        f"data.num_train_examples={data['num_train']}",
        f"data.num_eval_examples={data['num_eval']}",
        f"data.global_batch_size={row.batch}",
        "data.eval_batch_size=1024",
        f"data.num_cores={NUM_CORES}",
        f"data.replicas_per_host={NUM_CORES}",
        "data.min_crop_area=0.5",
        "data.random_flip=true",
        f"loop.train_epochs={epochs}",
        "loop.eval_every_epochs=1",
        "loop.target_top1=none",
        "loop.strategy=mirrored",
        f"loop.seed={seed}",
    ]


def train_row(row: Row, data: dict, args, seed: int) -> dict:
    """Trains one row with ``python -m trainer_module`` on 8 logical CPUs; returns its metrics.json.

    With ``--reuse``, a finished run of the same row, seed, epochs and resolution in the work directory is
    taken as it is (a study interrupted after some rows goes on with the rest).
    """
    model_dir = os.path.join(args.work_dir, "runs", f"{row.name}-seed{seed}")
    metrics_path = os.path.join(model_dir, "metrics.json")
    if args.reuse and os.path.exists(metrics_path):
        with open(os.path.join(model_dir, "config.json")) as f:
            saved = json.load(f)["config"]
        if (saved["loop"]["train_epochs"], saved["model"]["image_size"]) == (args.epochs, args.image_size):
            print(f"[study] {row.name} seed {seed}: reusing the finished run in {model_dir}", flush=True)
            with open(metrics_path) as f:
                return {**json.load(f), "wall_seconds": float("nan")}
    shutil.rmtree(model_dir, ignore_errors=True)
    command = [sys.executable, "-m", "trainer_module", "--preset", "demo", "--model-dir", model_dir]
    command += ["--train-files", data["train"], "--eval-files", data["eval"], "--cpu-devices", str(NUM_CORES)]
    for override in row_overrides(row, data, args.epochs, args.image_size, seed):
        command += ["--set", override]
    log_path = model_dir + ".log"
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    start = time.time()
    with open(log_path, "w") as log:
        done = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"[study] {row.name} failed (exit {done.returncode}); see {log_path}")
    with open(os.path.join(model_dir, "metrics.json")) as f:
        metrics = json.load(f)
    metrics["wall_seconds"] = time.time() - start
    return metrics


# ---------------------------------------------------------------------------------------------- report


def summarise(row: Row, runs: list[dict], epochs: int) -> dict:
    """Peak top-1 and when it was reached, averaged over seeds (as the paper averages three runs)."""
    peaks = [max(run["history"], key=lambda h: h["top1"]) for run in runs]
    return {
        "row": row.name,
        "optimizer": row.optimizer,
        "schedule": row.schedule,
        "batch": row.batch,
        "lr_per_256": row.lr_per_256,
        "warmup_epochs": row.warmup_epochs(epochs),
        "peak_top1": float(np.mean([p["top1"] for p in peaks])),
        "peak_top1_each": [p["top1"] for p in peaks],
        "epochs_to_peak": float(np.mean([p["epoch"] for p in peaks])),
        "seconds_to_peak": float(np.mean([p["elapsed_seconds"] for p in peaks])),
        "first_call_seconds": float(np.mean([run["first_call_seconds"] for run in runs])),
        "images_per_second": float(np.mean([run["images_per_second"] or 0.0 for run in runs])),
        "steps": runs[0]["steps"],
    }


def table(summaries: list[dict], baseline: dict) -> str:
    lines = [
        "| optimizer | batch | LR per 256 | warmup (epochs) | steps | peak top-1 | vs baseline | epochs to peak "
        "| time to peak (s) | images/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summaries:
        delta = (s["peak_top1"] - baseline["peak_top1"]) * 100
        lines.append(
            f"| {s['optimizer']} + {s['schedule']} | {s['batch']} | {s['lr_per_256']} | {s['warmup_epochs']:.2f} "
            f"| {s['steps']} | {s['peak_top1']:.4f} | {delta:+.2f} pt | {s['epochs_to_peak']:.1f} "
            f"| {s['seconds_to_peak']:.0f} | {s['images_per_second']:.0f} |"
        )
    return "\n".join(lines)


def plot(histories: dict[str, list[list[dict]]], path: str) -> None:
    """Figure 1 of the paper at small scale: top-1 against epochs and against time, one line per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, runs in histories.items():
        for i, history in enumerate(runs):
            label = name if i == 0 else None
            epochs = [h["epoch"] for h in history]
            minutes = [h["elapsed_seconds"] / 60 for h in history]
            top1 = [h["top1"] for h in history]
            (line,) = by_epoch.plot(epochs, top1, marker="o", markersize=3, label=label)
            by_time.plot(minutes, top1, marker="o", markersize=3, color=line.get_color(), label=label)
    by_epoch.set_xlabel("epoch")
    by_time.set_xlabel("minutes since the train-and-eval loop started (2 CPU cores)")
    for axis in (by_epoch, by_time):
        axis.set_ylabel("top-1 (Fashion-MNIST test set, averaged weights)")
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle("Large-batch study: top-1 against epochs and time (8 replicas, tiny EfficientNet)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default="/tmp/effnet-large-batch-study")
    parser.add_argument("--out-dir", default=os.path.join(REPO, "docs"))
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument(
        "--rows",
        default=",".join(r.name for r in ROWS),
        help="comma-separated row names, trained in this order",
    )
    parser.add_argument("--reuse", action="store_true", help="take finished rows from --work-dir as they are")
    args = parser.parse_args(argv)
    wanted = args.rows.split(",")
    by_name = {r.name: r for r in ROWS}
    rows = [by_name[name] for name in wanted if name in by_name]
    if len(rows) != len(wanted):
        parser.error(f"--rows: known rows are {', '.join(r.name for r in ROWS)}")

    study_start = time.time()
    data = prepare_shards(args.work_dir)
    print(f"[study] {data['num_train']} training / {data['num_eval']} test images", flush=True)
    histories, summaries = {}, []
    for row in rows:
        runs = []
        for seed in range(args.seeds):
            metrics = train_row(row, data, args, seed)
            runs.append(metrics)
            peak = max(h["top1"] for h in metrics["history"])
            rate = metrics["images_per_second"] or 0.0  # None when the run had a single (compiling) call
            print(
                f"[study] {row.name} seed {seed}: peak top-1 {peak:.4f} in {metrics['wall_seconds']:.0f}s "
                f"({rate:.0f} img/s, first call {metrics['first_call_seconds']:.0f}s)",
                flush=True,
            )
        histories[row.name] = [run["history"] for run in runs]
        summaries.append(summarise(row, runs, args.epochs))

    summaries.sort(key=lambda s: [r.name for r in ROWS].index(s["row"]))  # the table in the paper's order
    baseline = summaries[0]
    text = table(summaries, baseline)
    header = (
        f"Fashion-MNIST ({data['num_train']} train / {data['num_eval']} test), tiny EfficientNet at "
        f"{args.image_size} px, {args.epochs} epochs, {NUM_CORES} logical CPU replicas, {args.seeds} seed(s); "
        f"whole study {(time.time() - study_start) / 60:.1f} min on this machine."
    )
    print(header + "\n\n" + text)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "large_batch_study.md"), "w") as f:
        f.write(f"# Large-batch study (benchmarks/large_batch_study.py)\n\n{header}\n\n{text}\n")
    with open(os.path.join(args.out_dir, "large_batch_study.json"), "w") as f:
        json.dump({"args": vars(args), "summaries": summaries, "histories": histories}, f, indent=1)
    plot(histories, os.path.join(args.out_dir, "large_batch_study.png"))
    print(f"[study] wrote {os.path.join(args.out_dir, 'large_batch_study.md')} and .png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
