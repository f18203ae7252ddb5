"""python -m pipeline.kubeflow_v2_runner: compile the pipeline for Vertex AI Pipelines or Kubeflow; submit it.

The local runner's ``create_pipeline`` with the pipeline image on every step, a gs:// pipeline root, the Beam
steps on Dataflow, and the Trainer as a Vertex AI custom job on the machines of ``--accelerator`` (or on a
multi-host TPU VM slice) in ``--trainer-image``; the preset is checked against the accelerator first.
``--output X.json`` writes a Vertex PipelineJob, ``X.yaml`` a PipelineSpec for Kubeflow Pipelines. The inputs,
shard layout, epochs and top-1 gate are runtime parameters: ``--param NAME=VALUE`` sets their defaults, or
with ``--submit`` (or ``--template FILE --submit``) this run's values. Full commands: docs/vertex.md.

    python -m pipeline.kubeflow_v2_runner --preset b0-rmsprop-8x2048 --accelerator gpu-h100x8 --plan
    python -m pipeline.kubeflow_v2_runner --output effnet.json --project P --region us-central1 \\
        --image IMAGE@sha256:... --trainer-image IMAGE@sha256:... --pipeline-root gs://BUCKET/pipelines \\
        --accelerator tpu-v3-8 --preset b0-rmsprop-8x2048 --train-archive gs://BUCKET/train.tar \\
        --val-archive gs://BUCKET/val.tar --service-account SA@P.iam.gserviceaccount.com --submit
    python -m pipeline.kubeflow_v2_runner --template effnet.json --param train_epochs=30 --submit --wait
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

from components.accelerators import AcceleratorMismatch  # noqa: E402
from effnet_common import console, stopping  # noqa: E402
from pipeline import compiler, tune_flags  # noqa: E402
from pipeline.cloud import (  # noqa: E402
    DEFAULT_MAX_WAIT_HOURS,
    DEFAULT_REGION,
    EVALUATOR_WORKERS,
    PROVISIONING,
    SHARDING_WORKERS,
    CloudSettings,
    DataflowWorkers,
)


def parse_params(pairs: list[str]) -> dict:
    """``NAME=VALUE`` pairs of the compiled pipeline's runtime parameters, typed
    (``template.parse_params``)."""
    from pipeline import template

    return template.parse_params(
        pairs,
        {name: compiler.PARAMETER_TYPES[kind] for name, kind in compiler.RUNTIME_PARAMETERS.items()},
    )


# The flags' defaults are the cloud settings' own (one home for each).
CLOUD_DEFAULTS = {field.name: field.default for field in dataclasses.fields(CloudSettings)}


def build_parser() -> argparse.ArgumentParser:
    from components import accelerators
    from trainer_module.presets import preset_names  # the pipeline presets' names, without loading TensorFlow

    parser = console.ArgumentParser(
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
    what.add_argument(
        "--kfp-namespace", default="", help="with --kfp-host: the namespace (Kubeflow profile) to run in; a "
        "multi-user install needs it",
    )  # fmt: skip
    what.add_argument(
        "--kfp-token-file", default="", help="with --kfp-host: a file holding the bearer token for its API "
        "(a Kubernetes service-account token or one from the cluster's identity provider; default: the file "
        "kfp's KF_PIPELINES_SA_TOKEN_PATH names)",
    )  # fmt: skip
    what.add_argument(
        "--wait", action="store_true", help="with --submit: follow the run to its end; exit 0 if it succeeded"
    )
    what.add_argument(
        "--experiment", default="", metavar="NAME",
        help="with --submit to Vertex AI: put the run into this Vertex AI experiment (created if missing; "
        "4-128 of a-z, 0-9, '-'), where runs compare side by side",
    )  # fmt: skip
    where = parser.add_argument_group("where it runs")
    where.add_argument("--project", default="", help="compiling: required; with --template: as compiled")
    where.add_argument(
        "--region", default="", help=f"compiling: default {DEFAULT_REGION}; with --template: as compiled"
    )
    where.add_argument("--pipeline-root", default="", help="gs://BUCKET/PATH")
    where.add_argument("--image", default="", help="the pipeline image (Dockerfile target 'pipeline')")
    where.add_argument(
        "--trainer-image", default="", help="the training job's image (trainer-tpu / trainer-gpu)"
    )
    where.add_argument(
        "--accelerator",
        default=CLOUD_DEFAULTS["accelerator"],
        help="one of: " + ", ".join(accelerators.ACCELERATORS.names()),
    )
    where.add_argument(
        "--machines",
        type=int,
        default=CLOUD_DEFAULTS["machines"],
        help="machines of --accelerator (GPU machines)",
    )
    where.add_argument("--service-account", default="", help="for the pipeline, training and Dataflow jobs")
    where.add_argument("--network", default="", help="projects/PROJECT_NUMBER/global/networks/NAME")
    where.add_argument("--subnetwork", default="", help="Dataflow workers' regions/REGION/subnetworks/NAME")
    where.add_argument(
        "--tensorboard", default=CLOUD_DEFAULTS["tensorboard"], metavar="NAME",
        help="projects/P/locations/REGION/tensorboards/ID: a Vertex AI TensorBoard of --region the training "
        "and tuning jobs stream their curves and profiles to (needs --service-account)",
    )  # fmt: skip
    where.add_argument(
        "--provisioning",
        default=CLOUD_DEFAULTS["provisioning"],
        help="training machines: " + ", ".join(PROVISIONING.names()),
    )
    where.add_argument(
        "--max-wait-hours", type=float, default=CLOUD_DEFAULTS["max_wait_hours"],
        help=f"flex-start: how long the job waits for machines; a TPU VM slice: how long it may stay queued "
        f"(default {DEFAULT_MAX_WAIT_HOURS:g}; 0: indefinitely)",
    )  # fmt: skip
    where.add_argument(
        "--zone", default=CLOUD_DEFAULTS["zone"],
        help="a TPU VM slice's zone (multi-host slices: tpu-v3-32 and up, tpu-v4-16 and up, tpu-v5p-16 and "
        "up, tpu-v5litepod-16 and up; default: the first zone of --region that offers it)",
    )  # fmt: skip
    where.add_argument(
        "--max-recreations", type=int, default=CLOUD_DEFAULTS["max_recreations"],
        help="times a preempted or lost TPU VM slice is created again, the training resuming from its "
        "checkpoint (default %(default)s)",
    )  # fmt: skip
    where.add_argument(
        "--skip-region-check", action="store_true", help="compile for a region the accelerator table lacks"
    )
    where.add_argument("--reservation", default="", help="projects/P/zones/Z/reservations/NAME to train on")
    where.add_argument(
        "--training-timeout-hours", type=float, default=CLOUD_DEFAULTS["training_timeout_hours"],
        help="upper bound of the training job's timeout, which is 3x the estimate of the run's own epochs "
        "(--plan; at least 2 h); default: Vertex's 7 days",
    )  # fmt: skip
    where.add_argument(
        "--checkpoint-root", default="",
        help="gs:// directory keeping the training checkpoints by the run's settings: a re-run with the same "
        "settings resumes (default: in the run's own artifacts)",
    )  # fmt: skip
    for step, workers in (("dataflow", SHARDING_WORKERS), ("evaluator", EVALUATOR_WORKERS)):
        what = "the sharding step's" if step == "dataflow" else "the Evaluator's"
        where.add_argument(
            f"--{step}-machine-type", default=workers.machine_type, help=f"{what} Dataflow workers"
        )
        where.add_argument(
            f"--{step}-disk-gb",
            type=int,
            default=workers.disk_gb,
            help=f"{what} workers' disks (default %(default)s)",
        )
        where.add_argument(
            f"--{step}-max-workers", type=int, default=workers.max_workers,
            help=f"{what} most workers (default %(default)s)",
        )  # fmt: skip
    where.add_argument("--no-cache", action="store_true", help="run every step, reusing none")
    where.add_argument(
        "--api-outage-hours", type=float, default=CLOUD_DEFAULTS["api_outage_hours"],
        help="how long a step following its job, and --wait, wait out an outage of the service's API before "
        "giving up (default %(default)g; a 403/404 is waited out 5 minutes)",
    )  # fmt: skip
    where.add_argument(
        "--vertex-endpoint",
        default="",
        help="also push a blessed model to the Vertex Model Registry (a version of the pipeline's model) and "
        "serve it alone on this endpoint (display name, created if missing, or projects/.../endpoints/N)",
    )
    where.add_argument(
        "--serving-image",
        default="",
        help="the Vertex serving image for --vertex-endpoint: a prebuilt tf2-cpu/gpu image the pinned "
        "google-cloud-aiplatform lists, 2.15 or newer "
        "(e.g. us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest)",
    )
    run = parser.add_argument_group("what it runs")
    run.add_argument(
        "--preset", default="b0-rmsprop-8x2048", metavar="PRESET",
        help="what to train and how to shard (default %(default)s); one of: "
        + ", ".join(sorted(preset_names())),
    )  # fmt: skip
    inputs = {
        "train_archive": "gs://.../ILSVRC2012_img_train.tar",
        "val_archive": "gs://.../ILSVRC2012_img_val.tar",
        "train_dir": "gs://.../train/ (<wnid>/*.JPEG)",
        "val_dir": "gs://.../val/",
    }
    for key in compiler.INPUT_KEYS:
        run.add_argument(
            f"--{key.replace('_', '-')}", default="",
            help=f"{inputs[key]}: the default of --param {key} "
            "(a run needs a training and a validation input)",
        )  # fmt: skip
    tune = tune_flags.add_tune_flags(
        parser,
        "tuning (a Tuner step: trials on the accelerator's machines, in parallel)",
        max_epochs=0,
        max_epochs_help="every trial's schedule in epochs (default: a tenth of the run's)",
        max_trials=10,
    )
    tune.add_argument("--tune-parallel-trials", type=int, default=2, help="machines running trials at once")
    run.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
        help="trainer config override, e.g. --set optimizer.label_smoothing=0.1",
    )  # fmt: skip
    run.add_argument(
        "--param", dest="params", action="append", default=[], metavar="NAME=VALUE",
        help="a runtime parameter: " + ", ".join(compiler.RUNTIME_PARAMETERS),
    )  # fmt: skip
    return parser


def _settings(args) -> CloudSettings:
    return CloudSettings(
        project=args.project,
        region=args.region or DEFAULT_REGION,
        image=args.image,
        pipeline_root=args.pipeline_root,
        trainer_image=args.trainer_image,
        accelerator=args.accelerator,
        machines=args.machines,
        service_account=args.service_account,
        network=args.network,
        subnetwork=args.subnetwork,
        sharding_workers=DataflowWorkers(
            args.dataflow_machine_type, args.dataflow_disk_gb, args.dataflow_max_workers
        ),
        evaluator_workers=DataflowWorkers(
            args.evaluator_machine_type, args.evaluator_disk_gb, args.evaluator_max_workers
        ),
        provisioning=args.provisioning,
        max_wait_hours=args.max_wait_hours,
        reservation=args.reservation,
        training_timeout_hours=args.training_timeout_hours,
        checkpoint_root=args.checkpoint_root,
        check_region=not args.skip_region_check,
        enable_cache=not args.no_cache,
        api_outage_hours=args.api_outage_hours,
        zone=args.zone,
        max_recreations=args.max_recreations,
        tensorboard=args.tensorboard,
    )


def _print_plan(args) -> None:
    """The trainer's plan on the accelerator and the run's estimate (hours, accelerator-hours, timeout)."""
    from components import accelerators
    from pipeline import presets
    from trainer_module.config import parse_overrides
    from trainer_module.dry_run import plan_report

    machine = accelerators.get(args.accelerator, args.machines)
    if args.region and not args.skip_region_check:
        machine.check_region(args.region)
    preset = presets.get(args.preset)
    config = preset.resolve(parse_overrides(args.overrides), machine=machine).trainer_config
    estimate = accelerators.estimate(config, machine)
    report = {
        "accelerator": {**dataclasses.asdict(machine), "units": machine.units},  # what a quota counts
        "estimate": estimate.to_dict(),
        **plan_report(config, []),
    }
    if machine.slice_type is not None:
        from components import tpu_slices

        plan = config.plan
        report["tpu_vm"] = tpu_slices.slice_plan(
            machine.slice_type,
            config.data.global_batch_size,
            plan.bn_group_replicas,
            preset.train_shards,
            estimate.accelerator_hours,
        )
    print(json.dumps(report, indent=2))


def _check_output_name(output: str) -> None:
    if not output.endswith((".json", ".yaml", ".yml")):
        raise ValueError(f"--output {output!r} must end in .json (Vertex PipelineJob) or .yaml (KFP)")


def _check_output_directory(output: str) -> None:
    """``--output``'s directory exists (through gfile, local or gs://). Checked after the settings, the preset
    and the plan: gfile loads TensorFlow, seconds that a misspelt name should not wait for."""
    import tensorflow as tf

    directory = os.path.dirname(output)
    if directory and not tf.io.gfile.isdir(directory):
        raise ValueError(f"--output {output}: directory {directory} does not exist")


def _template_for(args):
    """The compiled template to submit, refused in one line when a given flag differs from what it was
    compiled for: its jobs (training, Dataflow) run in the compiled project, region, identity and network, and
    its serving directory and Dataflow temp location sit under the compiled pipeline root."""
    from pipeline.template import Template

    template = Template.read(args.template)
    mismatch = template.target.mismatch(
        project=args.project,
        region=args.region,
        service_account=args.service_account,
        network=args.network,
        tensorboard=args.tensorboard,
    )
    if mismatch:
        raise ValueError(mismatch)
    root = args.pipeline_root.rstrip("/")
    if root and template.pipeline_root and root != template.pipeline_root:
        raise ValueError(
            f"--pipeline-root {args.pipeline_root}: {args.template} was compiled for "
            f"{template.pipeline_root} (its serving directory and Dataflow temp location are under it); "
            f"compile again for another root"
        )
    if not template.pipeline_root and not root:
        raise ValueError(f"--pipeline-root: {args.template} names none; give the gs:// root of its artifacts")
    return template


def _check_destination(args, kubeflow: bool, path: str) -> None:
    """A PipelineSpec (``.yaml``) is submitted to Kubeflow Pipelines at ``--kfp-host`` (Vertex would run it
    without its baseline lookup), a PipelineJob (``.json``) to Vertex AI; the Kubeflow flags go with
    ``--kfp-host``. Refused in one line otherwise, before anything is compiled or sent."""
    if kubeflow and not args.kfp_host:
        raise ValueError(
            f"--kfp-host: {path} is a Kubeflow Pipelines PipelineSpec; give --kfp-host URL to submit it "
            "(Vertex AI takes the .json PipelineJob)"
        )
    if args.kfp_host and not kubeflow:
        raise ValueError(f"--kfp-host takes a PipelineSpec: compile to .yaml, not {path}")
    if not args.kfp_host:
        for flag, value in (
            ("--kfp-namespace", args.kfp_namespace),
            ("--kfp-token-file", args.kfp_token_file),
        ):
            if value:
                raise ValueError(f"{flag} goes with --kfp-host (a Kubeflow Pipelines endpoint)")


def _check_experiment(args) -> None:
    """``--experiment`` names a Vertex AI experiment a submitted Vertex run goes into (a Kubeflow run goes
    into the experiment named after the pipeline): refused in one line otherwise, before anything is
    loaded."""
    if not args.experiment:
        return
    from pipeline import vertex_submission

    if not args.submit:
        raise ValueError("--experiment puts a submitted run into a Vertex AI experiment: add --submit")
    if args.kfp_host:
        raise ValueError(
            "--experiment is a Vertex AI experiment; a Kubeflow Pipelines run goes into the experiment "
            "named after the pipeline"
        )
    vertex_submission.check_experiment_name(args.experiment)


def submit(template, args) -> int:
    """Checks the run's parameter values against the template, submits it, and with ``--wait`` follows the
    run to its end. Returns the exit status: 0 once submitted (or, with ``--wait``, when the run succeeded), 1
    when the run ended in another state, or when its state could not be read for ``--api-outage-hours`` (one
    line, the run going on)."""
    from effnet_common.cloud_retry import Patience
    from pipeline import kfp_submission, submission, vertex_submission

    _check_destination(args, not template.is_job, template.path)
    params = template.parse(args.params)
    template.check_values(params)  # the steps' own rules, before anything is submitted
    where = f"Kubeflow Pipelines at {args.kfp_host}" if args.kfp_host else "Vertex AI Pipelines"
    with stopping.describe(f"stopped while submitting: look for the run in {where} before submitting again"):
        if args.kfp_host:
            run = kfp_submission.submit_kfp(
                template, params, args.kfp_host, not args.no_cache, args.kfp_namespace, args.kfp_token_file
            )
        else:
            run = vertex_submission.submit_vertex(
                template, params, not args.no_cache, experiment=args.experiment
            )
    print(f"submitted {run.description}")
    print(f"follow it at {run.url}")
    for note in run.notes:
        print(note)
    if not args.wait:
        return 0
    with stopping.describe(
        f"the run goes on without this command following it: follow or cancel it at {run.url}"
    ):
        try:
            state = run.follow(
                on_change=lambda state: print(f"run state: {state}", flush=True),
                patience=Patience.of_hours(args.api_outage_hours),
            )
        except submission.Unfollowed as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    return 0 if submission.succeeded(state) else 1


def run(args) -> int:
    if args.plan:
        _print_plan(args)
        return 0
    if not (args.output or args.template):
        raise ValueError(
            "give --output FILE to compile, or --template FILE --submit to submit a compiled one"
        )
    if args.wait and not args.submit:
        raise ValueError("--wait follows a submitted run: add --submit")
    _check_experiment(args)
    if args.template:
        if not args.submit:
            raise ValueError("--template submits a compiled pipeline: add --submit")
        return submit(_template_for(args), args)
    return compile_run(args)


def compile_run(args) -> int:
    """Compiles to ``--output`` (``pipeline.compiler``), every setting checked before anything is written, and
    with ``--submit`` submits the compiled file."""
    from pipeline import presets
    from trainer_module.config import parse_overrides

    settings = _settings(args)
    _check_output_name(args.output)
    for_kubeflow = not args.output.endswith(".json")
    if args.submit:
        _check_destination(args, for_kubeflow, args.output)
    if args.vertex_endpoint and not args.serving_image:
        raise ValueError("--vertex-endpoint needs --serving-image (a Vertex prediction image for TensorFlow)")
    inputs = {key: getattr(args, key) for key in compiler.INPUT_KEYS if getattr(args, key)}
    params = parse_params(args.params)
    preset = presets.get(args.preset)
    compiled = compiler.plan_pipeline(
        preset,
        settings,
        inputs,
        parse_overrides(args.overrides),
        params,
        tune_flags.tuning_settings(args),
        args.tune_parallel_trials,
    )
    _check_output_directory(args.output)
    push = compiler.VertexPush(args.vertex_endpoint, args.serving_image) if args.vertex_endpoint else None
    warning = push.check(settings.region) if push else None
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    for image in settings.images_by_tag():
        print(
            f"warning: {image} is a tag; with step caching on, a re-pushed tag reuses steps run with the old "
            f"image: pass IMAGE@sha256:DIGEST (or --no-cache)",
            file=sys.stderr,
        )
    compiler.compile_pipeline(compiled, settings, args.output, push)
    machine = settings.machine
    replicas = console.plural(machine.replicas, "replica")
    print(f"compiled {args.output}: {preset.name} on {machine.describe()} ({replicas})")
    if for_kubeflow:
        print(
            "note: Kubeflow Pipelines runs no TFX resolver node, so this PipelineSpec has no "
            "latest-blessed-model baseline: its Evaluator blesses on the target top-1 alone "
            "(the .json PipelineJob for Vertex has both)"
        )
    if args.submit:
        from pipeline.template import Template

        return submit(Template.read(args.output), args)
    return 0


def main(argv: list[str] | None = None) -> int:
    # A session without a log file of its own: what TensorFlow, TFX and the Google clients print while
    # compiling stays off the console (its account is this program's own lines); Ctrl-C stops it in one line.
    with console.session(), stopping.describe("nothing was written or submitted"):
        args = build_parser().parse_args(argv)
        try:
            return run(args)
        except (AcceleratorMismatch, TypeError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return console.USAGE_EXIT


if __name__ == "__main__":
    from effnet_common import quick_exit

    quick_exit.exit_with(main())
