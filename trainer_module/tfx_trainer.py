"""The TFX Trainer's and Tuner's entry points: ``run_fn(fn_args)`` and ``tuner_fn(fn_args)``.

The trainer config travels as JSON in ``custom_config['trainer_config']`` (``TrainerConfig.to_json()``).
``trainer_module.run.run`` is the same entry point the CLI calls: it takes the epoch size from the shards'
manifest, so a preset's epoch means a pass over the real dataset.

``tuner_fn`` gives TFX's standard Tuner component a ``trainer_module.tuning`` search of that config, set by
``custom_config['tuning']``. The Tuner writes the best values, which the Trainer hands ``run_fn`` as
``fn_args.hyperparameters``: they override the config (epoch-denominated ones scaled to its budget) and the
run's config.json and report list them.

``custom_config['checkpoint_root']`` (optional) keeps the checkpoints outside the model directory, which is
new for every pipeline run, in a directory named by the run's resolved settings and data: the pipeline run
again with the same settings resumes from the last checkpoint (or only exports again); others start afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging

from trainer_module import files, run, train
from trainer_module.config import TrainerConfig

CONFIG_KEY = "trainer_config"
TUNING_KEY = "tuning"
CHECKPOINT_ROOT_KEY = "checkpoint_root"
# Settings that say where a run stops or runs, not what it trains: a run differing only in them continues the
# same checkpoints (as a truncated run continues with a later ``stop_at_epoch``).
NOT_IN_CHECKPOINT_KEY = ("loop.target_top1", "loop.stop_at_epoch", "loop.tpu_name")

logger = logging.getLogger("trainer_module")


def config_from_fn_args(fn_args) -> TrainerConfig:
    """The trainer config of ``fn_args.custom_config``."""
    custom = fn_args.custom_config or {}
    if CONFIG_KEY not in custom:
        raise ValueError(
            f"the Trainer's custom_config has no '{CONFIG_KEY}' (keys: {sorted(custom)}); "
            "pass {'trainer_config': TrainerConfig.to_json()}"
        )
    return TrainerConfig.from_json(custom[CONFIG_KEY])


def checkpoint_key(config: TrainerConfig, train_files, eval_files) -> str:
    """The name of the checkpoint directory of ``config`` trained on these shards: a digest of the settings
    (but ``NOT_IN_CHECKPOINT_KEY``) and of the shards' manifests (which name the shards relative to their
    directory, so the same data sharded again by another run gives the same name)."""
    from trainer_module.data import input_pipeline

    settings = config.to_dict()
    for dotted in NOT_IN_CHECKPOINT_KEY:
        section, name = dotted.split(".")
        settings[section].pop(name)
    shards = input_pipeline.list_files([*train_files, *eval_files])
    manifests = sorted({input_pipeline.manifest_path_of(path) for path in shards})
    # Shards without a manifest are named by their paths: a run on them resumes only from the same files.
    data = [
        input_pipeline.read_manifest(path).to_json() if files.exists(path) else path for path in manifests
    ]
    text = json.dumps({"settings": settings, "data": data}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def run_fn(fn_args) -> None:
    """TFX Trainer entry: trains with in-loop evaluation, writes TensorBoard summaries, checkpoints and
    metrics.json to ``fn_args.model_run_dir`` (the checkpoints under ``CHECKPOINT_ROOT_KEY`` when the config
    names one; the summaries where a Vertex AI job attached to a TensorBoard is told to write them:
    ``train.RunPaths``) and the SavedModel to ``fn_args.serving_model_dir``; the values a Tuner found
    (``fn_args.hyperparameters``) override the config."""
    from trainer_module import resolve

    train_files, eval_files = list(fn_args.train_files), list(fn_args.eval_files)
    resolved = resolve.resolve_run(
        config_from_fn_args(fn_args), hyperparameters=fn_args.hyperparameters or None
    )
    if resolved.tuned:
        logger.info("trainer config from the Tuner's values: %s", dict(resolved.tuned))
    checkpoints = ""
    root = (fn_args.custom_config or {}).get(CHECKPOINT_ROOT_KEY)
    if root:
        sized = resolved.with_data(resolve.data_sizes(train_files, eval_files)).config  # what the run trains
        checkpoints = files.join(root, checkpoint_key(sized, train_files, eval_files))
        logger.info("checkpoints of this run's settings: %s", checkpoints)
    paths = train.RunPaths(
        model_dir=fn_args.model_run_dir,
        export_dir=fn_args.serving_model_dir,
        checkpoints=checkpoints,
    )
    result = run.run(resolved, train_files, eval_files, paths, started=_process_start())
    logger.info("trainer finished: peak top-1 %s, final top-1 %s", result.peak_top1, result.final_top1)


# The entry points of a process that runs one TFX executor (a container of a Vertex or Kubeflow step, a TPU
# VM's worker): the Trainer's time starts with the process. Elsewhere (the local runner's pipeline, a test)
# the process ran other things first: the Trainer's time starts with ``run_fn``.
EXECUTOR_ENTRY_POINTS = (
    "tfx.scripts.run_executor",
    "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor",
    "components.run_page",
)


def _process_start() -> float | None:
    """The process's start when it runs this executor alone, else None."""
    import os
    import sys

    from effnet_common import goodput

    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is None or spec.name not in EXECUTOR_ENTRY_POINTS:
        return None
    return goodput.process_started(os.getpid())


def tuner_fn(fn_args):
    """TFX Tuner entry: a ``TunerFnResult`` holding the search of ``custom_config['tuning']`` over the config
    of ``custom_config['trainer_config']`` (resolved against the shards' manifests), trials on
    ``fn_args.train_files`` / ``eval_files``; each trial is handed its resolved run as a file and runs
    ``python -m trainer_module train --config`` on it.

    ``custom_config['tuning']`` (``TUNING_KEY``) holds ``search``, ``max_epochs``, ``max_trials``, ``factor``,
    ``iterations``, ``seed``, ``space`` ('KEY=KIND:LOW:HIGH' strings or ``Dimension`` dicts replacing or
    adding to the default space), ``only`` (tune those alone), ``cpu_devices`` and ``directory``: a root under
    which the search survives a restarted execution (else the Tuner's working directory holds its state).
    """
    from tfx.components.tuner.component import TunerFnResult

    from trainer_module import resolve, tuning

    train_files, eval_files = list(fn_args.train_files), list(fn_args.eval_files)
    # The trials' run against the shards' manifests (their epoch and classes), as each trial resolves it.
    sizes = resolve.data_sizes(train_files, eval_files, manifests_only=True)
    config = resolve.resolve_run(config_from_fn_args(fn_args), data=sizes).config
    settings = dict((fn_args.custom_config or {}).get(TUNING_KEY) or {})
    root = settings.pop("directory", None)
    search = tuning.search_of_config(config, train_files, eval_files, **settings)
    # Under a given root, each search has a directory of its own (named by what makes it that search): every
    # replica of a parallel search finds the same one, and a retried execution resumes it.
    directory = files.join(root, tuning.search_digest(search)) if root else fn_args.working_dir
    return TunerFnResult(tuner=tuning.build_tuner(search, directory), fit_kwargs={})
