"""A compiled pipeline read back: what ``--template FILE --submit`` needs, without compiling again.

A compiled Vertex ``PipelineJob`` (``.json``) or Kubeflow ``PipelineSpec`` (``.yaml``, schema 2.1.0) holds
everything a run is made of: its runtime parameters with their types and defaults, the trainer and sharding
configs its executors read (constants of the Trainer and sharding tasks), the pipeline root its serving
directory and Dataflow's temp location sit under, and where its jobs run (the training job's project,
region, service account and network, and its TensorBoard; Dataflow's are compiled from the same values).
``Template`` reads those back, so that a run is submitted where its jobs run and its parameter values are
checked, by the same functions the executors apply, before anything is submitted or paid for.
"""

from __future__ import annotations

import dataclasses
import functools
import json

# PipelineSpec 2.1 parameter types and the Python type of a value of each.
PARAMETER_TYPES = {"STRING": str, "NUMBER_INTEGER": int, "NUMBER_DOUBLE": float, "BOOLEAN": bool}
SCHEMA_VERSION = "2.1.0"
TRAINER_TASK = "Trainer"
SHARDING_TASK = "ImageNetShardGen"


@dataclasses.dataclass(frozen=True)
class JobTarget:
    """Where a compiled pipeline's jobs run: the training job's (and Dataflow's) project, region, identity and
    network, and the Vertex AI TensorBoard its training jobs stream to, as compiled into the Trainer's
    ``custom_config``."""

    project: str
    region: str
    service_account: str = ""
    network: str = ""
    tensorboard: str = ""

    def mismatch(self, **given: str) -> str | None:
        """One line naming the first given value that differs from the compiled one, or None."""
        for name, value in given.items():
            compiled = getattr(self, name)
            if value and value != compiled:
                flag = "--" + name.replace("_", "-")
                where = (
                    "which its training jobs stream their logs to"
                    if name == "tensorboard"
                    else "where its training job and Dataflow run"
                )
                return (
                    f"{flag} {value}: the template was compiled for {name.replace('_', ' ')} "
                    f"{compiled or '(none)'}, {where}; compile it again with {flag} {value}"
                )
        return None


def pipeline_tasks(spec: dict) -> dict[str, dict]:
    """Every task of a PipelineSpec by name: the root DAG's and those of the DAGs under it (a pipeline with an
    exit handler has its steps in the DAG the exit handler follows, TFX's ``tfx-dag``)."""
    tasks = {}
    pending = [spec.get("root", {})]
    while pending:
        for name, task in pending.pop().get("dag", {}).get("tasks", {}).items():
            tasks[name] = task
            pending.append(spec.get("components", {}).get(task.get("componentRef", {}).get("name", ""), {}))
    return tasks


def typed_value(name: str, value, parameter_type: str):
    """``value`` as the declared type of parameter ``name`` (JSON numbers of a PipelineJob are doubles).

    Raises:
      ValueError: naming the parameter and the type it takes.
    """
    kind = PARAMETER_TYPES.get(parameter_type)
    if kind is None:
        raise ValueError(f"parameter {name} has type {parameter_type!r}, which this runner does not take")
    try:
        if kind is int:
            number = float(value)
            if number != int(number):
                raise ValueError
            return int(number)
        if kind is bool and isinstance(value, str):
            return {"true": True, "false": False}[value.lower()]
        return kind(value)
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"--param {name}={value}: {name} takes {kind.__name__}") from None


def parse_params(pairs: list[str], parameter_types: dict[str, str]) -> dict:
    """``NAME=VALUE`` pairs of runtime parameters, each typed by its ``parameterType``.

    Raises:
      ValueError: a malformed pair, an undeclared name (listing the declared ones) or a value of the wrong
        type.
    """
    values = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise ValueError(f"--param {pair!r}: expected NAME=VALUE")
        if name not in parameter_types:
            raise ValueError(
                f"--param {name}: not a runtime parameter; declared: {', '.join(sorted(parameter_types))}"
            )
        values[name] = typed_value(name, text, parameter_types[name])
    return values


@dataclasses.dataclass(frozen=True)
class Template:
    """One compiled pipeline. ``document`` is the PipelineJob (``.json``) or the PipelineSpec (``.yaml``)."""

    path: str
    document: dict

    @classmethod
    def read(cls, path: str) -> Template:
        """Reads a compiled pipeline (any file system ``tf.io.gfile`` knows).

        Raises:
          ValueError: one line: the file is missing, not JSON/YAML, or not a pipeline this runner compiled.
        """
        import tensorflow as tf
        import yaml

        from trainer_module import files

        if not tf.io.gfile.exists(path):
            raise ValueError(f"--template {path}: no such file")
        try:
            document = yaml.safe_load(files.read_text(path))  # JSON is YAML
        except yaml.YAMLError as error:
            raise ValueError(f"--template {path}: not JSON or YAML ({str(error).splitlines()[0]})") from None
        template = cls(path, document if isinstance(document, dict) else {})
        tasks = pipeline_tasks(template.spec)
        if TRAINER_TASK not in tasks or SHARDING_TASK not in tasks:
            raise ValueError(f"--template {path}: not a pipeline compiled by pipeline.kubeflow_v2_runner")
        if template.spec.get("schemaVersion") != SCHEMA_VERSION:
            raise ValueError(
                f"--template {path}: PipelineSpec schema {template.spec.get('schemaVersion')}, compiled by "
                f"an earlier version of this runner; compile it again (Kubeflow and Vertex take "
                f"{SCHEMA_VERSION})"
            )
        return template

    @property
    def is_job(self) -> bool:
        """A Vertex PipelineJob (else a bare PipelineSpec for Kubeflow Pipelines)."""
        return "pipelineSpec" in self.document

    @property
    def spec(self) -> dict:
        return self.document.get("pipelineSpec", self.document)

    @property
    def name(self) -> str:
        return self.spec.get("pipelineInfo", {}).get("name", "")

    @property
    def labels(self) -> dict[str, str]:
        """The labels compiled onto a PipelineJob (none on a bare PipelineSpec): the run carries them, as its
        training and Dataflow jobs do."""
        return dict(self.document.get("labels", {})) if self.is_job else {}

    @property
    def pipeline_root(self) -> str:
        """The root it was compiled for: its serving directory and Dataflow's temp location sit under it."""
        root = self.spec.get("defaultPipelineRoot") or self.document.get("runtimeConfig", {}).get(
            "gcsOutputDirectory", ""
        )
        return root.rstrip("/")

    @functools.cached_property
    def parameters(self) -> dict[str, str]:
        """The runtime parameters' declared types (``parameterType``), by name."""
        declared = self.spec["root"].get("inputDefinitions", {}).get("parameters", {})
        return {name: spec.get("parameterType", "") for name, spec in declared.items()}

    @property
    def defaults(self) -> dict:
        declared = self.spec["root"].get("inputDefinitions", {}).get("parameters", {})
        return {
            name: typed_value(name, spec["defaultValue"], spec["parameterType"])
            for name, spec in declared.items()
            if "defaultValue" in spec
        }

    def parse(self, pairs: list[str]) -> dict:
        """``NAME=VALUE`` pairs typed by the declared parameters (``parse_params``)."""
        return parse_params(pairs, self.parameters)

    def constant(self, task: str, name: str):
        """The value compiled into ``task``'s input parameter ``name``."""
        binding = pipeline_tasks(self.spec)[task]["inputs"]["parameters"][name]
        return binding["runtimeValue"]["constant"]

    def bound_parameters(self, task: str) -> dict[str, str]:
        """``task``'s input parameters bound to runtime parameters: {input name: runtime parameter} (a DAG
        under the root declares the root's parameters under their own names)."""
        inputs = pipeline_tasks(self.spec)[task].get("inputs", {}).get("parameters", {})
        return {
            name: binding["componentInputParameter"]
            for name, binding in inputs.items()
            if "componentInputParameter" in binding
        }

    @functools.cached_property
    def trainer_custom_config(self) -> dict:
        return json.loads(self.constant(TRAINER_TASK, "custom_config"))

    @property
    def target(self) -> JobTarget:
        """Where the training job (and Dataflow) run, as compiled."""
        from tfx import v1 as tfx

        vertex = tfx.extensions.google_cloud_ai_platform
        config = self.trainer_custom_config
        training = config.get(vertex.TRAINING_ARGS_KEY, {})
        job_spec = training.get("job_spec", {})
        return JobTarget(
            project=training.get("project", ""),
            region=config.get(vertex.VERTEX_REGION_KEY, ""),
            service_account=job_spec.get("service_account", ""),
            network=job_spec.get("network", ""),
            tensorboard=job_spec.get("tensorboard", ""),
        )

    def check_values(self, values: dict) -> None:
        """Checks a run's parameter values as the steps will, before anything is submitted.

        Each value goes through the function its executor applies: the sharding step's inputs and layout
        through ``imagenet_shards.artifact_config`` (the ``ShardingConfig`` rules), the Trainer's epochs and
        target (also the Evaluator's gate) through ``runtime_gate.trainer_custom_config`` (the
        ``TrainerConfig`` rules).

        Raises:
          ValueError: one line naming the parameter and the rule it breaks.
        """
        from components import imagenet_shards, runtime_gate

        run = {**self.defaults, **values}

        def bound(task: str) -> dict:
            return {
                name: run[source] for name, source in self.bound_parameters(task).items() if source in run
            }

        sharding = bound(SHARDING_TASK)
        try:
            imagenet_shards.artifact_config(
                self.constant(SHARDING_TASK, imagenet_shards.SHARDING_CONFIG_KEY), "<examples>", sharding
            )
        except (TypeError, ValueError) as error:
            named = ", ".join(f"{name}={value}" for name, value in sharding.items() if value != "")
            raise ValueError(f"runtime parameters {named}: {error}") from None
        trainer = bound(TRAINER_TASK)
        runtime_gate.trainer_custom_config(
            self.constant(TRAINER_TASK, "custom_config"),
            trainer.get(runtime_gate.TRAIN_EPOCHS_KEY),
            trainer.get(runtime_gate.TARGET_TOP1_KEY),
        )
