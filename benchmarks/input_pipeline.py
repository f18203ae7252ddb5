"""Training input pipeline throughput: fused decode-and-crop against decode-then-crop, and the cost of
AutoAugment / RandAugment, in the same run.

Shards of real-photo JPEGs of ImageNet-like size (``sample_data.photo_samples``, shorter side 180-375 px) are
written by beam_preprocess first (not timed). Then ``build_train_dataset`` runs on one host at the model
resolution (224 px by default) in two variants that differ only in decoding:

- ``fused``: ``decode_and_crop_jpeg`` decodes only the sampled crop window (what training uses);
- ``decode-then-crop`` (the baseline): decode the whole JPEG, then slice the window;
- ``fused + autoaugment`` and ``fused + randaugment``: the fused pipeline followed by the augmentation policy
  (AutoAugment policy v0; RandAugment with 2 layers at magnitude 10), as the paper presets train.

Each variant is warmed up, then timed in ``--rounds`` alternating rounds of ``--seconds`` each; the best round
counts (the machine may be shared). Printed: images/s of each, the ratio fused / baseline and each augmented
rate over the fused one, at 224 px and at the demo resolution (``--demo-size``, 32 px). ``--with-model`` also
times a training step of EfficientNet-B0 (``trainer_module.models.efficientnet.efficientnet('b0')``, SGD,
float32) on one fixed batch at the same resolution on this machine's default device, and prints each
pipeline's images/s over the model's (above 1: the pipeline keeps up with the model here).

    .venv/bin/python benchmarks/input_pipeline.py                # about 2 minutes on 2 cores
    .venv/bin/python benchmarks/input_pipeline.py --with-model   # plus the model's training step rate
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # run as a script: the packages are importable from the checkout

import tensorflow as tf  # noqa: E402

from beam_preprocess import sample_data  # noqa: E402
from beam_preprocess.config import ShardingConfig  # noqa: E402
from beam_preprocess.run import run  # noqa: E402
from effnet_common import schema  # noqa: E402
from trainer_module.config import AugmentConfig  # noqa: E402
from trainer_module.data import input_pipeline  # noqa: E402

NUM_SHARDS = 8
FUSED = "fused decode-and-crop"
BASELINE = "decode-then-crop"
AUTOAUGMENT = "fused + autoaugment"
RANDAUGMENT = "fused + randaugment"
# name -> build_train_dataset arguments of each variant.
VARIANTS = {
    FUSED: {"fused_decode_crop": True},
    BASELINE: {"fused_decode_crop": False},
    AUTOAUGMENT: {"augmentation": AugmentConfig(policy="autoaugment")},
    RANDAUGMENT: {"augmentation": AugmentConfig(policy="randaugment", num_layers=2, magnitude=10.0)},
}


@dataclasses.dataclass(frozen=True)
class Rate:
    name: str
    image_size: int
    images_per_s: float


def write_shards(work_dir: str, num_images: int, num_synsets: int) -> str:
    """Real-photo training shards under ``work_dir``; returns their glob."""
    samples = sample_data.photo_samples(num_images, num_synsets)
    contents = sample_data.write_archives(os.path.join(work_dir, "archives"), samples, val_fraction=0.0)
    output_dir = os.path.join(work_dir, "shards")
    config = ShardingConfig(
        output_dir=output_dir, train_archive=contents.train_archive, train_shards=NUM_SHARDS
    )
    result = run(config)
    written = result.split_records()[schema.TRAIN]
    if written != num_images:
        raise RuntimeError(f"beam_preprocess wrote {written} training records, expected {num_images}")
    return os.path.join(output_dir, schema.TRAIN, f"{schema.TRAIN}-*")


def images_per_second(iterator, batch_size: int, seconds: float) -> float:
    """Pulls batches for about ``seconds`` and returns the rate (the last batch is fully materialised)."""
    start = time.perf_counter()
    batches = 0
    while True:
        images, _ = next(iterator)
        batches += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            images.numpy()  # the clock stops only once the data is really there
            return batches * batch_size / (time.perf_counter() - start)


def time_pipelines(files: str, image_size: int, batch_size: int, seconds: float, rounds: int) -> list[Rate]:
    """Best-of-``rounds`` images/s of every variant, timed alternately."""
    iterators = {}
    for name, arguments in VARIANTS.items():
        dataset = input_pipeline.build_train_dataset(
            files, None, input_pipeline.TrainInputs(batch_size, image_size, **arguments)
        )
        iterators[name] = iter(dataset)
        for _ in range(3):  # warm-up: thread pools, autotuning, the shuffle buffer's first fill
            next(iterators[name])
    best = dict.fromkeys(iterators, 0.0)
    for _ in range(rounds):
        for name, iterator in iterators.items():
            best[name] = max(best[name], images_per_second(iterator, batch_size, seconds))
    return [Rate(name, image_size, rate) for name, rate in best.items()]


def model_images_per_second(image_size: int, batch_size: int, steps: int) -> float | None:
    """Training-step rate of EfficientNet-B0 on one fixed batch, or None if the model module is absent."""
    if importlib.util.find_spec("trainer_module.models.efficientnet") is None:
        return None
    import keras

    from trainer_module.models.efficientnet import efficientnet

    model = efficientnet("b0", input_size=image_size)
    optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    images = tf.random.uniform([batch_size, image_size, image_size, 3], 0.0, 255.0)
    labels = tf.random.uniform([batch_size], 0, schema.NUM_CLASSES, dtype=tf.int32)

    @tf.function(jit_compile=False)
    def train_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    train_step().numpy()  # trace and compile
    start = time.perf_counter()
    for _ in range(steps):
        loss = train_step()
    loss.numpy()
    return steps * batch_size / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=400, help="real-photo JPEGs in the shards")
    parser.add_argument("--num-synsets", type=int, default=10)
    parser.add_argument("--image-size", type=int, default=224, help="model resolution timed first")
    parser.add_argument("--demo-size", type=int, default=32, help="second resolution timed; 0 skips it")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch of the pipeline")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of one timed round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per variant (best counts)")
    parser.add_argument("--with-model", action="store_true", help="also time EfficientNet-B0 training steps")
    parser.add_argument("--model-batch-size", type=int, default=16)
    parser.add_argument("--model-steps", type=int, default=5)
    parser.add_argument("--work-dir", default="", help="where the shards go (default: a temp dir, removed)")
    args = parser.parse_args(argv)

    work_dir = args.work_dir or tempfile.mkdtemp(prefix="input_pipeline_bench_")
    try:
        start = time.perf_counter()
        files = write_shards(work_dir, args.num_images, args.num_synsets)
        print(
            f"shards: {args.num_images} real-photo JPEGs in {NUM_SHARDS} shards, written in "
            f"{time.perf_counter() - start:.1f}s (not timed); {os.cpu_count()} CPUs, TensorFlow {tf.__version__}"
        )
        sizes = [args.image_size] + ([args.demo_size] if args.demo_size else [])
        rates = {}
        for size in sizes:
            for rate in time_pipelines(files, size, args.batch_size, args.seconds, args.rounds):
                rates[(rate.name, size)] = rate.images_per_s
        print(f"\ntraining input pipeline, one host, batch {args.batch_size}, best of {args.rounds} rounds:")
        print(f"  {'resolution':>10}  {FUSED:>22}  {BASELINE + ' (baseline)':>27}  {'ratio':>6}")
        for size in sizes:
            fused, baseline = rates[(FUSED, size)], rates[(BASELINE, size)]
            print(f"  {size:>7} px  {fused:>16.0f} img/s  {baseline:>21.0f} img/s  {fused / baseline:>5.2f}x")
        print("\naugmentation on top of the fused pipeline (ratio to the fused pipeline without it):")
        for size in sizes:
            for name in (AUTOAUGMENT, RANDAUGMENT):
                rate = rates[(name, size)]
                print(f"  {size:>7} px  {name:>22}  {rate:>8.0f} img/s  {rate / rates[(FUSED, size)]:>5.2f}x")

        if args.with_model:
            model_rate = model_images_per_second(args.image_size, args.model_batch_size, args.model_steps)
            if model_rate is None:
                print(
                    "\n--with-model: trainer_module.models.efficientnet is not there yet; model timing skipped"
                )
            else:
                device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
                print(
                    f"\nEfficientNet-B0 training step at {args.image_size} px on this {device}, batch "
                    f"{args.model_batch_size}: {model_rate:.1f} img/s. Input pipeline / model (above 1: the "
                    "input keeps up; both share these CPUs):"
                )
                for name in (FUSED, AUTOAUGMENT, RANDAUGMENT):
                    print(f"  {name:>22}  {rates[(name, args.image_size)] / model_rate:>6.1f}x")
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
