"""The train-and-evaluate loop of the recipe, read top to bottom:

strategy -> datasets -> model and optimizer under the strategy's scope -> compiled train and eval steps ->
loop (train one evaluation interval, several steps per compiled call; evaluate on the same replicas; log;
checkpoint; stop at the target top-1 or the epoch budget) -> metrics.json and the exported SavedModel.

``loop.stop_at_epoch`` ends the loop early, at an evaluation, with the schedule of the whole budget: a
truncated run, which the same config with a later (or no) stop resumes as if it had never stopped. Time to
accuracy is the paper's: from the start of the train-and-eval loop to the evaluation that reached peak top-1.
A run killed at any point resumes from its last checkpoint with the right step, learning rate and data
position (the training stream is seeded and skips what was already consumed).

``loop.seed`` fixes everything random: initial weights, dropout and stochastic depth, file and record order,
crops and augmentation. With ``loop.deterministic`` TensorFlow's ops run deterministically as well, so two
runs of one config on the same hardware and software end with the same weights and metrics, bit for bit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

import keras
import tensorflow as tf
from tensorflow.python.framework import config as tf_framework_config

from effnet_common import stopping
from trainer_module import files
from trainer_module.config import TrainerConfig
from trainer_module.data import input_pipeline, release
from trainer_module.distribute.batchnorm import GroupedBatchNormalization
from trainer_module.goodput_log import GoodputLog
from trainer_module.models.efficientnet import efficientnet
from trainer_module.optim import optimizers, schedules
from trainer_module.optim.averaging import WeightAverage, averaged_variables
from trainer_module.profiling import VERTEX_TENSORBOARD_ENV, StepProfiler
from trainer_module.recorder import STEP_RECORDS, Recorder, RunResult, TrainingCall

CHECKPOINT_DIR = "checkpoints"


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss; the last good checkpoint is kept."""


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """Where a run writes: checkpoints, logs, TensorBoard, the export, metrics (local paths or URLs).

    ``checkpoints`` puts the checkpoints (and the evaluation history beside them) in a directory of their own
    instead of ``model_dir/checkpoints``: one that outlives the run, which a later run resumes from.

    The TensorBoard summaries (and profiles) go to ``tensorboard_dir``, else where a Vertex AI job attached to
    a TensorBoard instance is told to write them (``AIP_TENSORBOARD_LOG_DIR``, streamed to the instance), else
    ``model_dir/tensorboard``.

    ``exports`` False: the run writes no SavedModel (a search's trial, whose evaluations are its result).
    """

    model_dir: str
    tensorboard_dir: str = ""
    export_dir: str = ""
    checkpoints: str = ""
    exports: bool = True

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoints or files.join(self.model_dir, CHECKPOINT_DIR)

    @property
    def resolved_tensorboard_dir(self) -> str:
        vertex = os.environ.get(VERTEX_TENSORBOARD_ENV, "")
        return self.tensorboard_dir or vertex or files.join(self.model_dir, "tensorboard")

    @property
    def resolved_export_dir(self) -> str:
        return self.export_dir or files.join(self.model_dir, "export")


def build_model(config: TrainerConfig) -> keras.Model:
    """EfficientNet of the config with grouped synchronised batch norm as its normalisation layer."""

    plan = config.plan

    def norm_layer(name: str) -> keras.layers.Layer:
        return GroupedBatchNormalization(
            group_size=plan.bn_group_replicas,
            layout=config.model.bn_group_layout,
            momentum=config.model.bn_momentum,
            epsilon=config.model.bn_epsilon,
            name=name,
            virtual_batch=config.model.bn_virtual_batch,
        )

    return efficientnet(
        config.model.variant,
        num_classes=config.model.num_classes,
        input_size=plan.input_size,
        dropout_rate=plan.classifier_dropout,
        drop_connect_rate=config.model.drop_connect_rate,
        norm_layer=norm_layer,
        precision=config.model.precision,
    )


def l2_variables(model: keras.Model, includes_biases: bool = False) -> list:
    """Weights that carry the L2 term when the optimizer does not decay them itself: not batch norm's, and not
    biases unless ``includes_biases`` (``optimizer.l2_includes_biases``, the reference's sum over every
    variable whose name lacks 'batch_normalization')."""
    patterns = optimizers.BATCH_NORM_PATTERNS if includes_biases else optimizers.DEFAULT_EXCLUDE
    return [v for v in model.trainable_variables if not optimizers.is_excluded(v.path, patterns)]


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy, TensorFlow and Keras: the initial weights, the dropout and stochastic-depth masks.

    Keras draws each initializer's and each dropout layer's seed from Python's ``random`` when the layer is
    built, so a model built right after this call starts from the same weights and mask stream every time.
    Process-wide, like any global seed.
    """
    keras.utils.set_random_seed(seed)


def random_states(model: keras.Model) -> list:
    """The states of the model's random streams (dropout and stochastic depth), in layer order.

    Keras keeps each stream's position in a variable of a ``SeedGenerator`` that TensorFlow's checkpoint of
    the model does not save, so a resumed run would draw the masks of step 0 again; checkpointed beside the
    model, a resumed run draws the masks it would have drawn.
    """
    return [v for v in model.non_trainable_variables if v.path.endswith("seed_generator_state")]


@contextlib.contextmanager
def op_determinism(enabled: bool):
    """TensorFlow's deterministic op implementations inside the block (``enable_op_determinism``), when
    ``enabled``; the previous process-wide setting is restored at exit, so later work in the same process (the
    TFX Evaluator, other tests) runs as it would have.

    Under it TensorFlow raises for ops without a deterministic implementation, runs tf.data ``map`` and
    ``interleave`` in order, and refuses unseeded random ops.
    """
    if not enabled or tf_framework_config.is_op_determinism_enabled():
        yield
        return
    tf.config.experimental.enable_op_determinism()
    try:
        yield
    finally:
        tf_framework_config.disable_op_determinism()  # the public API has no switch back


class Trainer:
    """Holds the model, optimizer and compiled steps of one run on one strategy.

    Building it seeds the process with ``loop.seed`` (see ``seed_everything``) before the model is built.
    """

    def __init__(self, config: TrainerConfig, strategy: tf.distribute.Strategy):
        self.config = config
        self.strategy = strategy
        plan = config.plan
        seed_everything(config.loop.seed)
        with strategy.scope():
            self.model = build_model(config)
            schedule = schedules.build_schedule(config.schedule, plan.peak_learning_rate, plan.schedule_steps)
            self.optimizer = optimizers.build_optimizer(config.optimizer, schedule)
            self.optimizer.build(self.model.trainable_variables)
            # Moving averages of the weights and batch-norm statistics (None when optimizer.ema_decay is 0).
            self.average = (
                WeightAverage(averaged_variables(self.model), config.optimizer.ema_decay)
                if config.optimizer.ema_decay
                else None
            )
            # Seconds already spent in the train-and-eval loop by earlier attempts of this run.
            self.elapsed = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="elapsed_seconds")
        self._l2_vars = l2_variables(self.model, config.optimizer.l2_includes_biases)
        # Traced once: a new tf.function per evaluation would retrace the swap every time.
        self._swap_averages = tf.function(self.average.swap) if self.average is not None else None
        tracked = {"weight_average": self.average} if self.average is not None else {}
        self.checkpoint = tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            elapsed=self.elapsed,
            random_states=random_states(self.model),
            **tracked,
        )

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    @property
    def learning_rate(self) -> float:
        """The learning rate of the next step (the schedule at the optimizer's iteration count)."""
        return float(self.optimizer.learning_rate.numpy())

    @contextlib.contextmanager
    def evaluation_weights(self):
        """The weights the recipe evaluates and exports: the moving averages when averaging is on.

        Inside the block the model holds the averages (weights and batch-norm statistics); after it, the
        training weights again.
        """
        if self.average is None:
            yield
            return
        with self.strategy.scope():
            self._swap_averages()
            try:
                yield
            finally:
                self._swap_averages()

    def _loss(self, labels, logits):
        """Per-replica shares of the global-batch mean loss (the smoothed cross-entropy + L2 when the
        optimizer does not decay) and of its regularisation term (0 without one)."""
        config = self.config
        one_hot = tf.one_hot(labels, config.model.num_classes, dtype=tf.float32)
        per_example = keras.losses.categorical_crossentropy(
            one_hot,
            tf.cast(logits, tf.float32),
            from_logits=True,
            label_smoothing=config.optimizer.label_smoothing,
        )
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=config.data.global_batch_size)
        regularisation = tf.constant(0.0)
        l2_weight = config.plan.l2_loss_weight
        if l2_weight:
            l2 = tf.add_n([tf.nn.l2_loss(v) for v in self._l2_vars])
            regularisation = l2_weight * l2 / self.strategy.num_replicas_in_sync
            loss += regularisation
        return loss, regularisation

    def _train_step(self, batch):
        """One step on one replica; returns its shares of the loss, the regularisation and the plain
        cross-entropy (no label smoothing: the quantity evaluation reports)."""
        images, labels = batch
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            loss, regularisation = self._loss(labels, logits)
        grads = tape.gradient(loss, self.model.trainable_variables)
        # Keras sums the per-replica gradients across replicas before the update.
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        # Outside the tape: the gradient is the one of ``loss`` alone, computed as before.
        plain = keras.losses.sparse_categorical_crossentropy(
            labels, tf.cast(logits, tf.float32), from_logits=True
        )
        cross_entropy = tf.nn.compute_average_loss(
            plain, global_batch_size=self.config.data.global_batch_size
        )
        return {"loss": loss, "regularisation": regularisation, "cross_entropy": cross_entropy}

    @tf.function
    def train_loop(self, iterator, num_steps):
        """``num_steps`` training steps in one compiled call (the on-device loop of the TPU recipe).

        Returns, per step (``STEP_RECORDS``), what the run's training curves are drawn from, so that a call of
        many steps still gives points at any cadence: the loss, its regularisation term and the plain
        cross-entropy over the global batch, the learning rate of the next step, and the host's clock
        (``_clock``, seconds) once the step's loss is known.
        """
        records = {key: tf.TensorArray(tf.float32, size=num_steps) for key in STEP_RECORDS if key != "time"}
        clock = tf.TensorArray(tf.float64, size=num_steps)
        for index in tf.range(num_steps):
            per_replica = self.strategy.run(self._train_step, args=(next(iterator),))
            values = {
                key: self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
                for key, value in per_replica.items()
            }
            if self.average is not None:
                self.average.update(self.optimizer.iterations)
            values["learning_rate"] = tf.cast(self.optimizer.learning_rate, tf.float32)
            records = {key: records[key].write(index, values[key]) for key in records}
            with tf.control_dependencies(list(values.values())):
                clock = clock.write(index, _clock())
        return {**{key: array.stack() for key, array in records.items()}, "time": clock.stack()}

    def _eval_step(self, batch):
        images, labels, mask = (
            batch[input_pipeline.IMAGES],
            batch[input_pipeline.LABELS],
            batch[input_pipeline.MASK],
        )
        logits = tf.cast(self.model(images, training=False), tf.float32)
        safe_labels = tf.maximum(labels, 0)  # padding carries label -1 and mask 0
        per_example = keras.losses.sparse_categorical_crossentropy(safe_labels, logits, from_logits=True)
        top1 = tf.cast(tf.math.in_top_k(safe_labels, logits, 1), tf.float32)
        top5 = tf.cast(
            tf.math.in_top_k(safe_labels, logits, min(5, self.config.model.num_classes)), tf.float32
        )
        return tf.stack(
            [
                tf.reduce_sum(top1 * mask),
                tf.reduce_sum(top5 * mask),
                tf.reduce_sum(per_example * mask),
                tf.reduce_sum(mask),
            ]
        )

    @tf.function
    def eval_loop(self, iterator, num_steps):
        """Sums of [top-1 hits, top-5 hits, loss, real examples] over ``num_steps`` batches, all replicas."""
        totals = tf.zeros([4])
        for _ in tf.range(num_steps):
            per_replica = self.strategy.run(self._eval_step, args=(next(iterator),))
            totals += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return totals


def _clock() -> tf.Tensor:
    """Seconds on the clock of the host running the loop, as an op of the traced loop: TensorFlow's timestamp,
    or, under op determinism (which refuses that op), Python's ``time.perf_counter`` through ``py_function``.
    Only differences within one call are used; the timestamp op needs no Python where the loop runs."""
    if tf_framework_config.is_op_determinism_enabled():
        return tf.py_function(time.perf_counter, [], tf.float64)
    return tf.timestamp()


def measure_allreduce_seconds(trainer: Trainer, repeats: int = 5) -> float | None:
    """Seconds one all-reduce of a full set of gradients takes on this strategy (None on one replica).

    Timed apart from the step, on zero tensors of the gradients' shapes, with the same reduction the optimizer
    uses; divided by the step time it gives the share of a step spent in gradient all-reduce.
    """
    strategy = trainer.strategy
    if strategy.num_replicas_in_sync == 1:
        return None
    shapes = [v.shape for v in trainer.model.trainable_variables]

    def replica_fn():
        context = tf.distribute.get_replica_context()
        return context.all_reduce(tf.distribute.ReduceOp.SUM, [tf.zeros(shape) for shape in shapes])

    reduce_all = tf.function(lambda: strategy.run(replica_fn))
    reduce_all()  # trace and warm up
    start = time.time()
    for _ in range(repeats):
        reduce_all()
    return (time.time() - start) / repeats


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this task writes the run's files (under MultiWorkerMirroredStrategy only worker 0 does)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type or isinstance(strategy, tf.distribute.TPUStrategy):
        return True
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker"
        and resolver.task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict()
    )


def _task_dir(paths: RunPaths, strategy) -> str:
    """model_dir for the chief; other workers keep their own (identical) checkpoints and log beside it."""
    if is_chief(strategy):
        return paths.model_dir
    resolver = strategy.cluster_resolver
    return files.join(paths.model_dir, "workers", f"{resolver.task_type}-{resolver.task_id}")


def _task_checkpoint_dir(paths: RunPaths, strategy) -> str:
    """This task's checkpoints: the run's checkpoint directory for the chief; another worker's own beside its
    log, or, when the run's checkpoints have a directory of their own, in it (so that they outlive the run
    with the chief's)."""
    if not paths.checkpoints:
        return files.join(_task_dir(paths, strategy), CHECKPOINT_DIR)
    if is_chief(strategy):
        return paths.checkpoints
    resolver = strategy.cluster_resolver
    return files.join(paths.checkpoints, "workers", f"{resolver.task_type}-{resolver.task_id}")


@dataclasses.dataclass
class RunInputs:
    """The distributed datasets of a run and its evaluation plan, built once.

    Attributes:
      train: the endless training stream (an iterator over per-replica batches).
      evaluation: the evaluation dataset; iterate it once per evaluation.
      eval_plan: steps and example count of one evaluation pass (the same on every host).
    """

    train: object
    evaluation: tf.distribute.DistributedDataset
    eval_plan: input_pipeline.EvalPlan

    @classmethod
    def build(
        cls, config: TrainerConfig, train_files, eval_files, strategy, start_step: int, recorder: Recorder
    ):
        plan = config.plan
        train_list = input_pipeline.list_files(train_files)
        eval_list = input_pipeline.list_files(eval_files)
        # The label numbering of the shards' manifests (ImageNet's, or a --classes found run's); both splits'.
        synsets = input_pipeline.shard_classes(train_list + eval_list)
        eval_plans: dict[tuple[int, int], input_pipeline.EvalPlan] = {}

        def train_dataset(ctx):
            files_of_host = input_pipeline.pipeline_files(
                train_list, ctx.num_input_pipelines, ctx.input_pipeline_id
            )
            recorder.event("train_files", input_pipeline_id=ctx.input_pipeline_id, files=files_of_host)
            # A resumed run skips the records earlier attempts consumed (before decoding, so it is cheap).
            consumed = start_step * ctx.get_per_replica_batch_size(config.data.global_batch_size)
            consumed *= input_pipeline.replicas_per_pipeline(ctx)
            return input_pipeline.build_train_dataset(
                train_list,
                ctx,
                input_pipeline.TrainInputs.of(config, synsets, skip_records=consumed),
            )

        def eval_dataset(ctx):
            # The plan counts every host's records; it depends only on the pipeline and replica counts.
            key = (ctx.num_input_pipelines, ctx.num_replicas_in_sync)
            if key not in eval_plans:
                eval_plans[key] = input_pipeline.eval_plan(eval_list, plan.eval_global_batch_size, ctx)
            return input_pipeline.build_eval_dataset(
                eval_list,
                ctx,
                input_pipeline.EvalInputs.of(config, synsets),
                plan=eval_plans[key],
            )

        train_dist = strategy.distribute_datasets_from_function(train_dataset)
        eval_dist = strategy.distribute_datasets_from_function(eval_dataset)
        return cls(iter(train_dist), eval_dist, next(iter(eval_plans.values())))

    def release_training_stream(self) -> None:
        """Lets go of the training stream without waiting for its deletion (``data.release``)."""
        stream, self.train = [self.train], None
        release.release_in_background(stream)


def train_and_evaluate(
    config: TrainerConfig,
    train_files: list[str],
    eval_files: list[str],
    paths: RunPaths,
    strategy: tf.distribute.Strategy,
    tuned: dict | None = None,
    timeline: GoodputLog | None = None,
) -> tuple[RunResult, Trainer]:
    """Trains with in-loop evaluation until the target top-1 or the epoch budget; returns the result.

    Args:
      config: the resolved trainer config (saved beside the run as config.json).
      train_files / eval_files: file patterns of the TFRecord shards written by beam_preprocess.
      paths: where checkpoints, logs, TensorBoard summaries, metrics.json and the export go.
      strategy: the strategy built by ``trainer_module.distribute.strategies.build_strategy``.
      tuned: the settings of ``config`` that came from a hyperparameter search, recorded in config.json.
      timeline: the attempt's goodput record (``trainer_module.goodput_log``); one starting now if None.
    """
    if timeline is None:
        timeline = GoodputLog(paths.checkpoint_dir, time.time())
        timeline.chief = is_chief(strategy)
    with op_determinism(config.loop.deterministic):
        with timeline.timed("TRAINING_PREP"):
            prepared = _prepare(config, train_files, eval_files, paths, strategy, tuned)
        return _train_and_evaluate(config, paths, strategy, prepared, timeline)


@dataclasses.dataclass
class _Prepared:
    """What the training loop starts from: the recorder, the model and its optimizer (restored), the
    checkpoint manager, the inputs and the step."""

    recorder: Recorder
    trainer: Trainer
    manager: tf.train.CheckpointManager
    inputs: RunInputs
    step: int


def _prepare(config, train_files, eval_files, paths, strategy, tuned) -> _Prepared:
    plan = config.plan
    chief = is_chief(strategy)
    task_dir = _task_dir(paths, strategy)
    recorder = Recorder(
        log_dir=task_dir,
        model_dir=paths.model_dir,
        checkpoint_dir=paths.checkpoint_dir,
        tensorboard_dir=paths.resolved_tensorboard_dir,
        chief=chief,
        global_batch_size=config.data.global_batch_size,
        steps_per_epoch=plan.steps_per_epoch,
        summary_every_steps=config.loop.summary_every_steps,
    )
    trainer = Trainer(config, strategy)
    manager = tf.train.CheckpointManager(
        trainer.checkpoint, _task_checkpoint_dir(paths, strategy), max_to_keep=3
    )
    restored = manager.restore_or_initialize()
    step = trainer.step
    if restored:
        recorder.resume(step)
    recorder.write_config(config.to_json(), plan.to_dict(), tuned)
    inputs = RunInputs.build(config, train_files, eval_files, strategy, step, recorder)
    recorder.event(
        "start",
        step=step,
        total_steps=plan.total_steps,
        stop_step=plan.stop_step,
        resumed=bool(restored),
        replicas=strategy.num_replicas_in_sync,
        eval_examples=inputs.eval_plan.num_examples,
        eval_steps=inputs.eval_plan.steps,
    )
    recorder.flush()
    return _Prepared(recorder, trainer, manager, inputs, step)


def _train_and_evaluate(config, paths, strategy, prepared: _Prepared, timeline: GoodputLog):
    plan, recorder, trainer, inputs = config.plan, prepared.recorder, prepared.trainer, prepared.inputs
    loop_start = time.time() - float(trainer.elapsed.numpy())
    loop = config.loop
    profiler = StepProfiler(loop.profile_from_step, loop.profile_steps, paths.resolved_tensorboard_dir)
    try:
        with recorder.interruptions():
            step = _train_loop(config, prepared, profiler, loop_start, timeline)
    finally:
        profiler.close()
    inputs.release_training_stream()

    # A truncated run (loop.stop_at_epoch) says where it stopped; run again with a later epoch, it resumes.
    stopped_at_epoch = None
    if plan.stop_step < plan.total_steps and step >= plan.stop_step:
        stopped_at_epoch = config.loop.stop_at_epoch
        recorder.event("stopped", step=step, epoch=stopped_at_epoch, train_epochs=config.loop.train_epochs)
    return (
        recorder.finish(
            config.loop.target_top1,
            replicas=strategy.num_replicas_in_sync,
            eval_examples=inputs.eval_plan.num_examples,
            allreduce=measure_allreduce_seconds(trainer),
            stopped_at_epoch=stopped_at_epoch,
        ),
        trainer,
    )


def _train_loop(config, prepared: _Prepared, profiler, loop_start, timeline: GoodputLog) -> int:
    """Trains and evaluates from the prepared step to the run's stop (or its target); returns the step it
    ended at."""
    plan, target = config.plan, config.loop.target_top1
    recorder, trainer, manager = prepared.recorder, prepared.trainer, prepared.manager
    inputs, step = prepared.inputs, prepared.step
    while step < plan.stop_step and not recorder.peak_reached(target):
        next_eval = plan.next_eval_step(step)
        while step < next_eval:
            num = profiler.limit(step, min(plan.steps_per_loop, next_eval - step))
            profiler.before(step)
            started = time.time()
            records = _labels_checked(config, trainer.train_loop, inputs.train, tf.constant(num))
            call = TrainingCall.of(step + num, time.time() - started, records)
            timeline.training_call(call, started)
            non_finite = call.first_non_finite()
            if non_finite is not None:
                bad_step, loss = non_finite
                recorder.event("non_finite_loss", step=bad_step, loss=loss)
                raise NonFiniteLossError(
                    f"training loss became {loss} at step {bad_step} "
                    f"(of the call of steps {step + 1}-{step + num}); the last good checkpoint "
                    f"({manager.latest_checkpoint}) is kept. Lower schedule.lr_per_256 or check the input "
                    "data."
                )
            step += num
            recorder.training(call, plan.stop_step)
            traced = profiler.after(step)
            if traced:
                recorder.profiled(traced, profiler.first, step)
        with timeline.timed("EVAL"), trainer.evaluation_weights():
            result = _evaluate(trainer, inputs.evaluation, inputs.eval_plan, config)
        trainer.elapsed.assign(time.time() - loop_start)
        recorder.evaluation(step, float(trainer.elapsed.numpy()), result)
        with timeline.timed("CHECKPOINT_SAVE"):
            # The history goes first: if the run dies between the two, the resumed run redoes this evaluation.
            recorder.flush()
            _save(manager, step)
        timeline.flush()  # the evaluation and the checkpoint are on the record before the next call
    return step


def last_checkpoint_step(checkpoint_dir: str) -> int | None:
    """The step of the latest checkpoint in ``checkpoint_dir`` (saved as ``ckpt-<step>``), or None."""
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    return int(latest.rpartition("-")[2]) if latest else None


def _save(manager: tf.train.CheckpointManager, step: int) -> None:
    """Checkpoints ``step``. TensorFlow writes a checkpoint's parts under ``<prefix>_temp``, then merges them
    into place; Ctrl-C in between (``effnet_common.stopping``) removes that directory as a clean exit does."""
    parts = files.join(manager.directory, f"ckpt-{step}_temp")
    with stopping.cleanup(lambda: files.remove_tree(parts)):
        manager.save(checkpoint_number=step)


def _labels_checked(config: TrainerConfig, loop_fn, *args):
    """Runs a compiled loop; a shard's wrong label surfaces as one ``LabelError`` line."""
    try:
        return loop_fn(*args)
    except tf.errors.InvalidArgumentError as error:
        input_pipeline.raise_label_error(error, config.data.label_offset, config.model.num_classes)
        raise


def _evaluate(trainer: Trainer, eval_dist, eval_plan, config: TrainerConfig) -> dict:
    stream = [iter(eval_dist)]  # deleted off this thread (trainer_module.data.release)
    totals = _labels_checked(config, trainer.eval_loop, stream[0], tf.constant(eval_plan.steps))
    release.release_in_background(stream)
    top1, top5, loss, count = totals.numpy().tolist()
    if int(round(count)) != eval_plan.num_examples:
        raise RuntimeError(f"evaluation counted {count} examples, expected exactly {eval_plan.num_examples}")
    return {"top1": top1 / count, "top5": top5 / count, "loss": loss / count, "examples": int(round(count))}
