"""python -m pipeline.kubeflow_v2_runner: compile the pipeline for Vertex AI Pipelines or Kubeflow, and submit.

The same ``create_pipeline`` as the local runner, with: the pipeline image on every step, a gs:// pipeline
root, the sharding step's Beam pipeline on Dataflow, and the Trainer as a Vertex AI custom job on the
machines of ``--accelerator`` (a single-host TPU slice, or one or more 8-GPU machines) in ``--trainer-image``.
The preset is checked against the accelerator before anything is written. ``--output`` ending in ``.json``
writes a Vertex PipelineJob; ``.yaml`` writes a bare PipelineSpec for open-source Kubeflow Pipelines.

The inputs, the shard layout, the training epochs and the top-1 gate are runtime parameters of the compiled
pipeline (``--param NAME=VALUE`` at compile time sets their defaults; with ``--submit``, or ``--template FILE
--submit`` for a pipeline compiled earlier, the values of this run; or the Vertex console's run form).

    python -m pipeline.kubeflow_v2_runner --output effnet.json --project P --region us-central1 \\
        --image us-docker.pkg.dev/P/effnet/pipeline@sha256:... \\
        --trainer-image us-docker.pkg.dev/P/effnet/trainer-tpu@sha256:... \\
        --pipeline-root gs://BUCKET/pipelines --accelerator tpu-v3-8 --preset b0-rmsprop-8x2048 \\
        --train-archive gs://BUCKET/ILSVRC2012_img_train.tar --val-archive gs://BUCKET/ILSVRC2012_img_val.tar \\
        --service-account effnet@P.iam.gserviceaccount.com --submit
    python -m pipeline.kubeflow_v2_runner --template effnet.json --project P --region us-central1 \\
        --pipeline-root gs://BUCKET/pipelines --param train_epochs=30 --param target_top1=0.5 --submit
    python -m pipeline.kubeflow_v2_runner --preset b0-rmsprop-8x2048 --accelerator gpu-h100x8 --plan
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", category=FutureWarning)

from pipeline.accelerators import AcceleratorMismatch  # noqa: E402

# The runtime parameters of a compiled pipeline and their types (names as the Vertex run form shows them).
RUNTIME_PARAMETERS = {
    "train_archive": str,
    "val_archive": str,
    "train_dir": str,
    "val_dir": str,
    "train_shards": int,
    "val_shards": int,
    "train_epochs": int,
    "target_top1": float,
}
INPUT_KEYS = ("train_archive", "val_archive", "train_dir", "val_dir")
# Dataflow workers for ImageNet's sharding: 4 vCPUs decode and check JPEGs; the spill goes to GCS, so the
# disk holds the image and Beam's staging only.
DATAFLOW_MACHINE_TYPE = "n1-standard-4"
DATAFLOW_DISK_GB = 50
# A Vertex network: projects/{project number}/global/networks/{name} (VPC peering with Vertex AI).
_NETWORK = re.compile(r"^projects/[^/]+/global/networks/(?P<name>[^/]+)$")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


@dataclasses.dataclass(frozen=True)
class CloudSettings:
    """Where and on what the pipeline runs in the cloud.

    Attributes:
      project / region: the Google Cloud project and region of Vertex AI and Dataflow.
      image: the pipeline image (Dockerfile target ``pipeline``) for every step and the Dataflow workers.
      pipeline_root: gs:// root of the pipeline's artifacts.
      trainer_image: the training job's image (``trainer-tpu`` or ``trainer-gpu``); '' uses ``image``.
      accelerator: the ``--accelerator`` name; ``machines``: how many of it (GPU machines only).
      service_account: runs the pipeline job, the training job and the Dataflow workers ('' = defaults).
      network: ``projects/NUMBER/global/networks/NAME`` peered with Vertex AI, for the pipeline and training
        jobs; Dataflow workers join the network NAME (and ``subnetwork`` when given).
      subnetwork: Dataflow's ``regions/REGION/subnetworks/NAME`` (or a full URL).
      dataflow_machine_type / dataflow_disk_gb / dataflow_max_workers: the sharding step's Dataflow workers.
      enable_cache: let Vertex reuse a step whose inputs, parameters and image are unchanged.
    """

    project: str
    region: str
    image: str
    pipeline_root: str
    trainer_image: str = ""
    accelerator: str = "tpu-v3-8"
    machines: int = 1
    service_account: str = ""
    network: str = ""
    subnetwork: str = ""
    dataflow_machine_type: str = DATAFLOW_MACHINE_TYPE
    dataflow_disk_gb: int = DATAFLOW_DISK_GB
    dataflow_max_workers: int = 100
    enable_cache: bool = True

    def __post_init__(self):
        if not self.pipeline_root.startswith("gs://"):
            raise ValueError(
                f"--pipeline-root {self.pipeline_root!r} must be a gs:// path on Vertex / Kubeflow"
            )
        for name in ("project", "region", "image"):
            if not getattr(self, name):
                raise ValueError(f"--{name} is required to compile for the cloud")
        if self.network and not _NETWORK.match(self.network):
            raise ValueError(
                f"--network {self.network!r} must be projects/PROJECT_NUMBER/global/networks/NAME"
            )
        if self.dataflow_disk_gb < 0 or self.dataflow_max_workers < 1:
            raise ValueError("--dataflow-disk-gb must be >= 0 and --dataflow-max-workers >= 1")
        self.machine  # noqa: B018 - an unknown or unavailable accelerator fails here

    @property
    def machine(self):
        from pipeline import accelerators

        return accelerators.get(self.accelerator, self.machines)

    @property
    def training_image(self) -> str:
        return self.trainer_image or self.image

    def images_by_tag(self) -> list[str]:
        """Images given by a mutable tag rather than a digest."""
        return [
            image for image in dict.fromkeys((self.image, self.training_image)) if not _DIGEST.search(image)
        ]

    def dataflow_args(self) -> list[str]:
        args = [
            "--runner=DataflowRunner",
            f"--project={self.project}",
            f"--region={self.region}",
            f"--temp_location={self.pipeline_root.rstrip('/')}/beam-tmp",
            f"--sdk_container_image={self.image}",
            "--sdk_location=container",
            f"--max_num_workers={self.dataflow_max_workers}",
            f"--worker_machine_type={self.dataflow_machine_type}",
            f"--disk_size_gb={self.dataflow_disk_gb}",
        ]
        if self.service_account:
            args.append(f"--service_account_email={self.service_account}")
        if self.network:
            args.append(f"--network={_NETWORK.match(self.network)['name']}")
        if self.subnetwork:
            args.append(f"--subnetwork={self.subnetwork}")
        return args

    def vertex_training_config(self) -> dict:
        """``custom_config`` entries of the Vertex Trainer: a custom job on the accelerator's worker pools."""
        from tfx import v1 as tfx

        vertex = tfx.extensions.google_cloud_ai_platform
        job_spec = {"worker_pool_specs": self.machine.worker_pool_specs(self.training_image)}
        if self.service_account:
            job_spec["service_account"] = self.service_account
        if self.network:
            job_spec["network"] = self.network
        return {
            vertex.ENABLE_VERTEX_KEY: True,
            vertex.VERTEX_REGION_KEY: self.region,
            vertex.TRAINING_ARGS_KEY: {"project": self.project, "job_spec": job_spec},
        }


@dataclasses.dataclass(frozen=True)
class VertexPush:
    """Optional push of the blessed model to the Vertex AI Model Registry, deployed to ``endpoint``."""

    endpoint: str
    serving_image: str
    machine_type: str = "n1-standard-4"

    def component(self, settings: CloudSettings):
        """A builder of TFX's Vertex Pusher (a new Model resource per push, deployed to the endpoint)."""
        from tfx import v1 as tfx

        vertex = tfx.extensions.google_cloud_ai_platform
        config = {
            vertex.ENABLE_VERTEX_KEY: True,
            vertex.VERTEX_REGION_KEY: settings.region,
            vertex.VERTEX_CONTAINER_IMAGE_URI_KEY: self.serving_image,
            vertex.SERVING_ARGS_KEY: {
                "project_id": settings.project,
                "endpoint_name": self.endpoint,
                "machine_type": self.machine_type,
            },
        }

        def build(model, blessing):
            return vertex.Pusher(model=model, model_blessing=blessing, custom_config=config).with_id(
                "VertexPusher"
            )

        return build


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What ``plan_pipeline`` resolved: the trainer config and the runtime parameters' default values."""

    preset: object
    trainer_config: object
    sharding: object
    defaults: dict


def plan_pipeline(
    preset_name: str, settings: CloudSettings, inputs: dict, overrides: list[str], params: dict
):
    """Resolves and checks everything a compilation needs, before anything is written.

    The trainer config is the preset's with the accelerator's strategy and replicas per host, then the
    user's overrides; it must fit the accelerator. The runtime parameters' defaults come from the preset,
    the inputs and ``params`` (already typed), and are validated as the executors will validate them.

    Raises:
      AcceleratorMismatch / ValueError: one line naming the problem.
    """
    from pipeline import presets
    from trainer_module.config import with_overrides

    preset = presets.get(preset_name)
    machine = settings.machine
    config = with_overrides(preset.trainer_config(), [*machine.trainer_overrides(), *overrides])
    machine.check(preset.name, config)
    defaults = {
        **{key: inputs.get(key, "") for key in INPUT_KEYS},
        "train_shards": preset.train_shards,
        "val_shards": preset.val_shards,
        "train_epochs": config.loop.train_epochs,
        "target_top1": preset.target_top1 if config.loop.target_top1 is None else config.loop.target_top1,
        **params,
    }
    sharding = dataclasses.replace(
        preset.sharding_config(**{key: defaults[key] for key in INPUT_KEYS}),
        num_hosts=config.plan.hosts,
        train_shards=defaults["train_shards"],
        val_shards=defaults["val_shards"],
    )
    config = with_overrides(
        config,
        [f"loop.train_epochs={defaults['train_epochs']}", f"loop.target_top1={defaults['target_top1']}"],
    )
    return Compiled(preset, config, sharding, defaults)


def build_pipeline(compiled: Compiled, settings: CloudSettings, vertex_push: VertexPush | None = None):
    """The cloud pipeline: Dataflow sharding, training on the accelerator in Vertex, TFMA gate, Pusher(s)."""
    from tfx.orchestration import data_types

    from components import runtime_gate
    from pipeline import pipeline_def

    runtime = {
        name: data_types.RuntimeParameter(name=name, ptype=kind, default=compiled.defaults[name])
        for name, kind in RUNTIME_PARAMETERS.items()
    }
    root = settings.pipeline_root.rstrip("/")
    return pipeline_def.create_pipeline(
        pipeline_name=f"effnet-{compiled.preset.name}",
        pipeline_root=root,
        sharding=compiled.sharding,
        trainer_config=compiled.trainer_config,
        target_top1=compiled.defaults["target_top1"],
        serving_model_dir=f"{root}/serving_model",
        metadata_connection_config=None,  # Vertex / Kubeflow bring their own metadata store
        beam_pipeline_args=settings.dataflow_args(),
        trainer_class=runtime_gate.VertexTrainer,
        trainer_custom_config=settings.vertex_training_config(),
        enable_cache=settings.enable_cache,
        runtime=runtime,
        extra_pusher=vertex_push.component(settings) if vertex_push else None,
    )


def compile_pipeline(pipeline, image: str, output: str, defaults: dict) -> str:
    """Writes the Vertex PipelineJob (``.json``) or KFP PipelineSpec (``.yaml``) to ``output``.

    The runtime parameters' ``defaults`` go into the PipelineSpec's root input definitions (``defaultValue``,
    which TFX does not write) and, for a PipelineJob, into its ``runtimeConfig``.
    """
    import yaml
    from tfx import v1 as tfx

    from trainer_module import files

    runner = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(default_image=image),
        output_dir=os.path.dirname(output) or ".",
        output_filename=os.path.basename(output),
    )
    job = runner.run(pipeline, parameter_values=defaults, write_out=False)
    parameters = job["pipelineSpec"]["root"].get("inputDefinitions", {}).get("parameters", {})
    for name, spec in parameters.items():
        spec["defaultValue"] = defaults[name]
    if output.endswith(".json"):
        files.write_text(output, json.dumps(job, sort_keys=True))
    else:
        files.write_text(output, yaml.safe_dump(job["pipelineSpec"], sort_keys=True))
    return output


def template_parameters(template: str) -> dict[str, type]:
    """The runtime parameters a compiled template (``.json`` job or ``.yaml`` spec) declares, with types."""
    import yaml

    from trainer_module import files

    document = yaml.safe_load(files.read_text(template))  # JSON is YAML
    spec = document.get("pipelineSpec", document)
    declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
    kinds = {"INT": int, "NUMBER_INTEGER": int, "DOUBLE": float, "NUMBER_DOUBLE": float}
    return {name: kinds.get(p.get("type") or p.get("parameterType"), str) for name, p in declared.items()}


def parse_params(pairs: list[str], kinds: dict[str, type]) -> dict:
    """``NAME=VALUE`` pairs typed by the declared parameters.

    Raises:
      ValueError: a malformed pair, an undeclared name (listing the declared ones) or a value of the wrong type.
    """
    values = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise ValueError(f"--param {pair!r}: expected NAME=VALUE")
        if name not in kinds:
            raise ValueError(f"--param {name}: not a runtime parameter; declared: {', '.join(sorted(kinds))}")
        try:
            values[name] = kinds[name](text)
        except ValueError:
            raise ValueError(f"--param {pair}: {name} takes a {kinds[name].__name__}") from None
    return values


def vertex_job(template: str, settings: CloudSettings, params: dict | None = None, credentials=None):
    """The Vertex ``PipelineJob`` for a compiled template, built and validated locally (no network)."""
    from google.cloud import aiplatform

    from trainer_module import files

    display_name = json.loads(files.read_text(template))["displayName"]
    return aiplatform.PipelineJob(
        display_name=display_name,
        template_path=template,
        pipeline_root=settings.pipeline_root,
        parameter_values=params or {},
        project=settings.project,
        location=settings.region,
        enable_caching=settings.enable_cache,
        credentials=credentials,
    )


def submit(template: str, settings: CloudSettings, params: dict, kfp_host: str = "") -> str:
    """Sends the compiled pipeline to Vertex AI Pipelines, or to a Kubeflow Pipelines endpoint."""
    if kfp_host:
        import kfp

        if not template.endswith((".yaml", ".yml")):
            raise ValueError(f"--kfp-host takes a PipelineSpec: compile to .yaml, not {template}")

        run = kfp.Client(host=kfp_host).create_run_from_pipeline_package(
            template,
            arguments=params,
            pipeline_root=settings.pipeline_root,
            enable_caching=settings.enable_cache,
        )
        return f"KFP run {run.run_id}"
    job = vertex_job(template, settings, params)
    job.submit(service_account=settings.service_account or None, network=settings.network or None)
    return f"Vertex PipelineJob {job.resource_name}"


def build_parser() -> argparse.ArgumentParser:
    from pipeline import accelerators

    parser = argparse.ArgumentParser(
        prog="python -m pipeline.kubeflow_v2_runner",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = parser.add_argument_group("what to do")
    what.add_argument(
        "--output", default="", help="compile to effnet.json (Vertex PipelineJob) or effnet.yaml (KFP)"
    )
    what.add_argument("--template", default="", help="submit this compiled pipeline instead of compiling one")
    what.add_argument(
        "--plan", action="store_true", help="print the trainer's plan on the accelerator; compile nothing"
    )
    what.add_argument("--submit", action="store_true", help="send it to Vertex AI (or --kfp-host)")
    what.add_argument("--kfp-host", default="", help="a Kubeflow Pipelines endpoint instead of Vertex")
    where = parser.add_argument_group("where it runs")
    where.add_argument("--project", default="")
    where.add_argument("--region", default="us-central1")
    where.add_argument("--pipeline-root", default="", help="gs://BUCKET/PATH")
    where.add_argument("--image", default="", help="the pipeline image (Dockerfile target 'pipeline')")
    where.add_argument(
        "--trainer-image", default="", help="the training job's image (trainer-tpu / trainer-gpu)"
    )
    where.add_argument(
        "--accelerator", default="tpu-v3-8", help="one of: " + ", ".join(accelerators.ACCELERATORS.names())
    )
    where.add_argument("--machines", type=int, default=1, help="machines of --accelerator (GPU machines)")
    where.add_argument("--service-account", default="", help="for the pipeline, training and Dataflow jobs")
    where.add_argument("--network", default="", help="projects/PROJECT_NUMBER/global/networks/NAME")
    where.add_argument("--subnetwork", default="", help="Dataflow workers' regions/REGION/subnetworks/NAME")
    where.add_argument("--dataflow-machine-type", default=DATAFLOW_MACHINE_TYPE)
    where.add_argument("--dataflow-disk-gb", type=int, default=DATAFLOW_DISK_GB)
    where.add_argument("--dataflow-max-workers", type=int, default=100)
    where.add_argument("--no-cache", action="store_true", help="run every step, reusing none")
    where.add_argument(
        "--vertex-endpoint", default="", help="also push to the Vertex Model Registry + endpoint"
    )
    where.add_argument("--serving-image", default="", help="the Vertex serving image for --vertex-endpoint")
    run = parser.add_argument_group("what it runs")
    run.add_argument("--preset", default="b0-rmsprop-8x2048")
    for key in INPUT_KEYS:
        run.add_argument(f"--{key.replace('_', '-')}", default="")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    run.add_argument(
        "--param", dest="params", action="append", default=[], metavar="NAME=VALUE",
        help="a runtime parameter: " + ", ".join(RUNTIME_PARAMETERS),
    )  # fmt: skip
    return parser


def _settings(args) -> CloudSettings:
    return CloudSettings(
        project=args.project,
        region=args.region,
        image=args.image,
        pipeline_root=args.pipeline_root,
        trainer_image=args.trainer_image,
        accelerator=args.accelerator,
        machines=args.machines,
        service_account=args.service_account,
        network=args.network,
        subnetwork=args.subnetwork,
        dataflow_machine_type=args.dataflow_machine_type,
        dataflow_disk_gb=args.dataflow_disk_gb,
        dataflow_max_workers=args.dataflow_max_workers,
        enable_cache=not args.no_cache,
    )


def _print_plan(args) -> None:
    from pipeline import accelerators, presets
    from trainer_module.__main__ import plan_report
    from trainer_module.config import with_overrides

    machine = accelerators.get(args.accelerator, args.machines)
    preset = presets.get(args.preset)
    config = with_overrides(preset.trainer_config(), [*machine.trainer_overrides(), *args.overrides])
    machine.check(preset.name, config)
    print(json.dumps({"accelerator": dataclasses.asdict(machine), **plan_report(config, [])}, indent=2))


def _check_output(output: str) -> None:
    import tensorflow as tf

    if not output.endswith((".json", ".yaml", ".yml")):
        raise ValueError(f"--output {output!r} must end in .json (Vertex PipelineJob) or .yaml (KFP)")
    directory = os.path.dirname(output)
    if directory and not tf.io.gfile.isdir(directory):
        raise ValueError(f"--output {output}: directory {directory} does not exist")


def _check_template_root(template: str, pipeline_root: str) -> None:
    """The serving directory and Dataflow's temp location are compiled under the pipeline root, so a compiled
    PipelineJob runs under the root it was compiled for."""
    from trainer_module import files

    if not template.endswith(".json"):
        return
    compiled = json.loads(files.read_text(template)).get("runtimeConfig", {}).get("gcsOutputDirectory", "")
    if compiled and compiled.rstrip("/") != pipeline_root.rstrip("/"):
        raise ValueError(
            f"--pipeline-root {pipeline_root}: {template} was compiled for {compiled} (its serving directory and "
            f"Dataflow temp location are under it); compile again for another root"
        )


def run(args) -> int:
    if args.plan:
        _print_plan(args)
        return 0
    if not (args.output or args.template):
        raise ValueError(
            "give --output FILE to compile, or --template FILE --submit to submit a compiled one"
        )
    settings = _settings(args)
    if args.template:
        if not args.submit:
            raise ValueError("--template submits a compiled pipeline: add --submit")
        _check_template_root(args.template, settings.pipeline_root)
        params = parse_params(args.params, template_parameters(args.template))
        print(submit(args.template, settings, params, args.kfp_host))
        return 0
    _check_output(args.output)
    if args.vertex_endpoint and not args.serving_image:
        raise ValueError("--vertex-endpoint needs --serving-image (a Vertex prediction image for TensorFlow)")
    inputs = {key: getattr(args, key) for key in INPUT_KEYS if getattr(args, key)}
    params = parse_params(args.params, RUNTIME_PARAMETERS)
    compiled = plan_pipeline(args.preset, settings, inputs, args.overrides, params)
    push = VertexPush(args.vertex_endpoint, args.serving_image) if args.vertex_endpoint else None
    for image in settings.images_by_tag():
        print(
            f"warning: {image} is a tag; with step caching on, a re-pushed tag reuses steps run with the old "
            f"image: pass IMAGE@sha256:DIGEST (or --no-cache)",
            file=sys.stderr,
        )
    compile_pipeline(build_pipeline(compiled, settings, push), settings.image, args.output, compiled.defaults)
    machine = settings.machine
    print(
        f"compiled {args.output}: {compiled.preset.name} on {machine.describe()} ({machine.replicas} replicas)"
    )
    if args.submit:
        print(submit(args.output, settings, parse_params(args.params, RUNTIME_PARAMETERS), args.kfp_host))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (AcceleratorMismatch, TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
