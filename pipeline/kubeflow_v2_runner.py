"""python -m pipeline.kubeflow_v2_runner: compile the pipeline for Vertex AI Pipelines or Kubeflow, and submit.

The same ``create_pipeline`` as the local runner, with: the pipeline image on every step, a gs:// pipeline
root, the sharding component's Beam pipeline on Dataflow, and the Trainer as a Vertex AI custom training job
on a TPU slice (the Vertex training extension of TFX). ``--output`` ending in ``.json`` writes a Vertex
PipelineJob; ``.yaml`` writes a bare PipelineSpec for open-source Kubeflow Pipelines.

    python -m pipeline.kubeflow_v2_runner --output effnet.json --project P --region us-central1 \\
        --image us-docker.pkg.dev/P/effnet/pipeline:latest --pipeline-root gs://BUCKET/pipelines \\
        --train-archive gs://BUCKET/ILSVRC2012_img_train.tar --val-archive gs://BUCKET/ILSVRC2012_img_val.tar \\
        --preset b5-lars-1024x65536 --submit
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", category=FutureWarning)


@dataclasses.dataclass(frozen=True)
class CloudSettings:
    """Where and on what the pipeline runs in the cloud.

    Attributes:
      project / region: the Google Cloud project and region of Vertex AI and Dataflow.
      image: the pipeline image (Dockerfile at the repository root) for every step, Dataflow workers and the
        training job.
      pipeline_root: gs:// root of the pipeline's artifacts.
      tpu_type / tpu_count / tpu_topology: the Trainer's accelerator (Vertex machine spec); the topology is
        for multi-host slices, e.g. '4x4'.
      dataflow_max_workers: upper bound of Dataflow autoscaling for the sharding step.
    """

    project: str
    region: str
    image: str
    pipeline_root: str
    tpu_type: str = "TPU_V3"
    tpu_count: int = 8
    tpu_topology: str = ""
    dataflow_max_workers: int = 100

    def __post_init__(self):
        if not self.pipeline_root.startswith("gs://"):
            raise ValueError(
                f"pipeline_root {self.pipeline_root!r} must be a gs:// path on Vertex / Kubeflow"
            )
        for name in ("project", "region", "image"):
            if not getattr(self, name):
                raise ValueError(f"--{name} is required to compile for the cloud")

    def dataflow_args(self) -> list[str]:
        return [
            "--runner=DataflowRunner",
            f"--project={self.project}",
            f"--region={self.region}",
            f"--temp_location={self.pipeline_root.rstrip('/')}/beam-tmp",
            f"--sdk_container_image={self.image}",
            "--experiments=use_runner_v2",
            f"--max_num_workers={self.dataflow_max_workers}",
        ]

    def machine_spec(self) -> dict:
        spec = {
            "machine_type": "cloud-tpu",
            "accelerator_type": self.tpu_type,
            "accelerator_count": self.tpu_count,
        }
        if self.tpu_topology:
            spec["tpu_topology"] = self.tpu_topology
        return spec

    def vertex_training_config(self) -> dict:
        """``custom_config`` entries of the Vertex Trainer: a custom job on the TPU slice with our image."""
        from tfx import v1 as tfx

        vertex = tfx.extensions.google_cloud_ai_platform
        return {
            vertex.ENABLE_VERTEX_KEY: True,
            vertex.VERTEX_REGION_KEY: self.region,
            vertex.TRAINING_ARGS_KEY: {
                "project": self.project,
                "worker_pool_specs": [
                    {
                        "machine_spec": self.machine_spec(),
                        "replica_count": 1,
                        "container_spec": {"image_uri": self.image},
                    }
                ],
            },
        }


def build_pipeline(preset_name: str, settings: CloudSettings, sharding_inputs: dict, overrides: list[str]):
    """The cloud pipeline of a preset: Dataflow sharding, TPU training on Vertex, TFMA gate, Pusher."""
    from tfx import v1 as tfx

    from beam_preprocess.config import ShardingConfig
    from pipeline import pipeline_def, presets
    from trainer_module.config import with_overrides

    preset = presets.get(preset_name)
    sharding = ShardingConfig(
        output_dir=pipeline_def.ARTIFACT_OUTPUT_DIR,
        num_hosts=preset.num_hosts,
        train_shards=preset.train_shards,
        val_shards=preset.val_shards,
        **sharding_inputs,
    )
    trainer_config = with_overrides(preset.trainer_config(), ["loop.strategy=tpu", *overrides])
    root = settings.pipeline_root.rstrip("/")
    return pipeline_def.create_pipeline(
        pipeline_name=f"effnet-{preset.name}",
        pipeline_root=root,
        sharding=sharding,
        trainer_config=trainer_config,
        target_top1=preset.target_top1,
        serving_model_dir=f"{root}/serving_model",
        metadata_connection_config=None,  # Vertex / Kubeflow bring their own metadata store
        beam_pipeline_args=settings.dataflow_args(),
        trainer_factory=tfx.extensions.google_cloud_ai_platform.Trainer,
        trainer_custom_config=settings.vertex_training_config(),
    )


def compile_pipeline(pipeline, image: str, output: str) -> str:
    """Writes the Vertex PipelineJob (``.json``) or KFP PipelineSpec (``.yaml``) to ``output``."""
    from tfx import v1 as tfx

    if not output.endswith((".json", ".yaml", ".yml")):
        raise ValueError(f"--output {output!r} must end in .json (Vertex PipelineJob) or .yaml (KFP)")
    runner = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(default_image=image),
        output_dir=os.path.dirname(os.path.abspath(output)),
        output_filename=os.path.basename(output),
    )
    runner.run(pipeline)
    return output


def vertex_job(template: str, settings: CloudSettings, credentials=None):
    """The Vertex ``PipelineJob`` for a compiled template, built and validated locally (no network)."""
    from google.cloud import aiplatform

    with open(template) as f:
        display_name = json.load(f)["displayName"]
    return aiplatform.PipelineJob(
        display_name=display_name,
        template_path=template,
        pipeline_root=settings.pipeline_root,
        project=settings.project,
        location=settings.region,
        enable_caching=True,
        credentials=credentials,
    )


def submit(template: str, settings: CloudSettings, kfp_host: str = "") -> str:
    """Sends the compiled pipeline to Vertex AI Pipelines, or to a Kubeflow Pipelines endpoint."""
    if kfp_host:
        import kfp

        run = kfp.Client(host=kfp_host).create_run_from_pipeline_package(template, arguments={})
        return f"KFP run {run.run_id}"
    job = vertex_job(template, settings)
    job.submit()
    return f"Vertex PipelineJob {job.resource_name}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.kubeflow_v2_runner",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--output", required=True, help="effnet.json (Vertex PipelineJob) or effnet.yaml (KFP)"
    )
    parser.add_argument("--preset", default="b5-lars-1024x65536")
    parser.add_argument("--project", default="")
    parser.add_argument("--region", default="us-central1")
    parser.add_argument("--image", default="", help="the pipeline image (see Dockerfile)")
    parser.add_argument("--pipeline-root", default="", help="gs://BUCKET/PATH")
    parser.add_argument("--train-archive", default="")
    parser.add_argument("--val-archive", default="")
    parser.add_argument("--train-dir", default="")
    parser.add_argument("--val-dir", default="")
    parser.add_argument("--tfds-data-dir", default="")
    parser.add_argument("--tpu-type", default="TPU_V3")
    parser.add_argument("--tpu-count", type=int, default=8)
    parser.add_argument("--tpu-topology", default="")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--submit", action="store_true", help="send it to Vertex AI (or --kfp-host)")
    parser.add_argument("--kfp-host", default="", help="a Kubeflow Pipelines endpoint instead of Vertex")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    inputs = {
        key: getattr(args, key)
        for key in ("train_archive", "val_archive", "train_dir", "val_dir", "tfds_data_dir")
        if getattr(args, key)
    }
    try:
        settings = CloudSettings(
            project=args.project,
            region=args.region,
            image=args.image,
            pipeline_root=args.pipeline_root,
            tpu_type=args.tpu_type,
            tpu_count=args.tpu_count,
            tpu_topology=args.tpu_topology,
        )
        pipeline = build_pipeline(args.preset, settings, inputs, args.overrides)
        compile_pipeline(pipeline, args.image, args.output)
    except (TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"compiled {args.output}")
    if args.submit:
        print(submit(args.output, settings, args.kfp_host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
