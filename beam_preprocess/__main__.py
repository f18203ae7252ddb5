"""python -m beam_preprocess: ImageNet (archives, directories or tensorflow-datasets) -> per-host TFRecord
shards.

Options not listed here are Beam pipeline options and go to the runner unchanged, for example
``--direct_num_workers 2 --direct_running_mode multi_threading`` here (threads of this process, which leaves
out the connectors sharding never uses: faster than Beam's ``multi_processing`` workers, see
docs/sharding.md), or ``--runner DataflowRunner --project P --region R --temp_location gs://...
--setup_file ./setup.py`` at scale; an option that is neither this program's nor Beam's is refused (Beam
would drop it and run without it).

Exit status: 0 done, 2 a bad flag or input (more unusable images than --max-failures included), 130 Ctrl-C
(its partial shards and spill files removed) or a Dataflow job cancelled by Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# google-cloud clients warn about Python 3.11's end of life on import; it is not this program's concern.
# The environment variable carries the filter into Beam's worker processes.
os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
warnings.filterwarnings("ignore", category=FutureWarning)

from beam_preprocess import lean_imports  # noqa: E402

if __name__ == "__main__" and lean_imports.runs_on_direct_runner(sys.argv[1:]):
    # Run as the program (never when imported by a library or a test): before Beam is imported, refuse the
    # connectors sharding does not use (docs/performance.md, 'Sharding').
    lean_imports.install(local_only=not lean_imports.names_remote_paths(sys.argv[1:]))

from beam_preprocess import classes, sources, spill  # noqa: E402
from beam_preprocess.config import ShardingConfig, with_flag_names  # noqa: E402
from beam_preprocess.run import FailureBudgetExceeded, OutputExistsError, leftovers_message, run  # noqa: E402
from effnet_common import console, path_checks, schema, stopping, storage  # noqa: E402
from effnet_common.dataflow_jobs import TaskStopped  # noqa: E402

LOG_NAME = "beam_preprocess.log"
# The exit status of a run stopped by Ctrl-C or SIGTERM (its Dataflow job cancelled): the shell's for SIGINT.
STOPPED_EXIT = console.STOPPED_EXIT


# The options' defaults are the config's own (one home for each).
DEFAULTS = {field.name: field.default for field in dataclasses.fields(ShardingConfig)}


def build_parser() -> argparse.ArgumentParser:
    parser = console.ArgumentParser(
        prog="python -m beam_preprocess",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inputs = parser.add_argument_group("inputs (archives, or directories, or a tensorflow-datasets data dir)")
    inputs.add_argument(
        "--train-archive", default="", help="ILSVRC2012_img_train.tar (1000 inner <wnid>.tar)"
    )
    inputs.add_argument("--val-archive", default="", help="ILSVRC2012_img_val.tar (flat; official labels)")
    inputs.add_argument("--train-dir", default="", help="extracted training set: DIR/<wnid>/*.JPEG")
    inputs.add_argument("--val-dir", default="", help="validation: DIR/<wnid>/*.JPEG or flat official names")
    inputs.add_argument("--tfds-data-dir", default="", help="a data_dir holding a prepared imagenet2012")
    out = parser.add_argument_group("output")
    out.add_argument(
        "--output-dir", required=True, help="shards go to OUTPUT_DIR/<split>/, plus manifest.json"
    )
    out.add_argument(
        "--num-hosts", type=int, default=DEFAULTS["num_hosts"], help="shard counts become a multiple of this"
    )
    out.add_argument(
        "--train-shards",
        type=int,
        default=DEFAULTS["train_shards"],
        help="training shards (default: from --shard-mb)",
    )
    out.add_argument(
        "--val-shards",
        type=int,
        default=DEFAULTS["val_shards"],
        help="validation shards (default: from --shard-mb)",
    )
    out.add_argument(
        "--shard-mb",
        type=float,
        default=DEFAULTS["shard_mb"],
        help="target shard size in MiB (default %(default)s)",
    )
    out.add_argument(
        "--seed", type=int, default=DEFAULTS["seed"], help="seed of the training split's shuffle"
    )
    out.add_argument("--overwrite", action="store_true", help="replace the shards of an earlier run")
    labels = parser.add_argument_group("labels")
    labels.add_argument(
        "--classes",
        default=None,
        help=f"what labels number, one of {', '.join(classes.CLASS_LISTS.names())}: 'imagenet' (default: the "
        "1000 ILSVRC2012 synsets, labels 0..999), 'found' (the sorted synsets of the training input, labels "
        "0..K-1), 'file' (the synsets of --classes-file, in its order)",
    )
    labels.add_argument(
        "--classes-file",
        default="",
        help="one wnid a line, in label order ('#' comments and blank lines skipped); implies --classes file",
    )
    checks = parser.add_argument_group("failures")
    checks.add_argument(
        "--max-failures",
        type=int,
        default=DEFAULTS["max_failures"],
        help="unusable inputs tolerated before exiting non-zero (default 0)",
    )
    checks.add_argument(
        "--members-per-unit",
        type=int,
        default=DEFAULTS["members_per_unit"],
        help="validation images one worker reads at a time",
    )
    parser.add_argument(
        "--check-threads",
        type=int,
        default=DEFAULTS["check_threads"],
        help="threads each worker process decodes images on (default 0: one per core)",
    )
    parser.add_argument(
        "--worker-processes",
        type=int,
        default=DEFAULTS["worker_processes"],
        help="processes the workers hand each work unit and shard to (default: one per core when the "
        "DirectRunner's workers are threads; 0: none, Beam's workers do the work)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show Beam's and this program's logs live instead of writing them beside the output directory",
    )
    return parser


def parse_arguments(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This program's options, and the Beam pipeline options among the rest; any other argument is refused in
    one line naming it (Beam's own parser drops what it does not know, so a misspelt option would go
    unnoticed)."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    unknown, beam_options = beam_unknown_arguments(rest)
    if unknown:
        parser.more_options = tuple(beam_options)
        parser.error("unrecognized arguments: " + " ".join(unknown))
    return args, rest


def beam_unknown_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """The arguments of ``argv`` that no Beam pipeline option takes, and Beam's option strings: parsed by the
    parser Beam builds from every ``PipelineOptions`` class (handed out through its ``add_extra_args_fn``)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    built = []
    PipelineOptions(argv).get_all_options(add_extra_args_fn=built.append)
    _, unknown = built[0].parse_known_args(argv)
    return unknown, [option for action in built[0]._actions for option in action.option_strings]


def log_path(output_dir: str) -> str:
    """The run's log file: beside the output directory (which holds only shards and the manifest), or in it
    when it is a file system's or bucket's root."""
    trimmed = output_dir.rstrip("/")
    if not trimmed or storage.dirname(trimmed).endswith("://"):
        return storage.join(output_dir, LOG_NAME)
    return f"{trimmed}.{LOG_NAME}"


def preflight(args) -> ShardingConfig:
    """The config, the inputs (exist and readable) and the output directory (created last, so that a failed
    check leaves nothing behind), checked before any work.

    Raises:
      console.UsageError: naming the flag and the problem.
    """
    try:
        config = ShardingConfig(
            output_dir=args.output_dir,
            train_archive=args.train_archive,
            val_archive=args.val_archive,
            train_dir=args.train_dir,
            val_dir=args.val_dir,
            tfds_data_dir=args.tfds_data_dir,
            num_hosts=args.num_hosts,
            train_shards=args.train_shards,
            val_shards=args.val_shards,
            shard_mb=args.shard_mb,
            max_failures=args.max_failures,
            seed=args.seed,
            members_per_unit=args.members_per_unit,
            check_threads=args.check_threads,
            worker_processes=args.worker_processes,
            overwrite=args.overwrite,
            classes=args.classes or (classes.FILE if args.classes_file else classes.IMAGENET),
            classes_file=args.classes_file,
        )
    except ValueError as e:  # the message names the option
        raise console.UsageError("", "", with_flag_names(console.one_line(e))) from None
    if args.classes_file:
        path_checks.check_file("--classes-file", args.classes_file)
        try:
            classes.parse_class_list(storage.read_text(args.classes_file))
        except ValueError as e:  # a UnicodeDecodeError too
            raise console.UsageError("--classes-file", args.classes_file, console.one_line(e)) from None
    for flag, path in (("--train-archive", args.train_archive), ("--val-archive", args.val_archive)):
        if path:
            path_checks.check_file(flag, path)
    for flag, path in (("--train-dir", args.train_dir), ("--val-dir", args.val_dir)):
        if path:
            path_checks.check_directory(flag, path)
    if args.tfds_data_dir:
        for split in schema.SPLITS:
            try:
                sources.tfds_record_files(args.tfds_data_dir, split)
            except OSError as e:
                raise console.UsageError("--tfds-data-dir", args.tfds_data_dir, console.one_line(e)) from None
    path_checks.make_writable_directory("--output-dir", args.output_dir)
    return config


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with console.session(verbose=console.wants_verbose(argv)) as session:
        args, beam_args = parse_arguments(argv)
        try:
            config = preflight(args)
        except console.UsageError as e:
            return console.fail(e)
        session.keep_log(log_path(config.output_dir))
        console.say("sharding into %s (%s)", config.output_dir, console.plural(config.num_hosts, "host"))
        start = time.time()
        stopped = (
            f"the partial shards and spill files under {config.output_dir} were removed (the log "
            f"{log_path(config.output_dir)} is kept); run the same command again"
        )
        try:
            with stopping.describe(stopped):
                result = run(config, beam_args)
        except TaskStopped as e:  # Ctrl-C or SIGTERM while its Dataflow job ran: the job was cancelled
            console.fail(e)
            return console.fail(leftovers_message(config), status=STOPPED_EXIT)
        except OutputExistsError as e:
            return console.fail(e)
        except FailureBudgetExceeded as e:  # a bad input, as every command counts it
            return console.fail(e)
        except Exception as e:
            changed = spill.changed_source(e)
            if changed:  # an archive replaced between checking and writing: what changed, then the leftovers
                console.fail(changed)
                return console.fail(leftovers_message(config), status=1)
            # An error nobody foresaw: its traceback follows this line (which run_pipeline also logged).
            print(f"error: {leftovers_message(config)}", file=sys.stderr)
            raise
        seconds = time.time() - start
        for line in result.report(seconds).splitlines():
            console.say("%s", line)
        images = sum(info.read for info in result.manifest.splits.values())
        console.say("%d images in %s: %.0f images/s", images, console.duration(seconds), images / seconds)
    print(json.dumps({"manifest": config.manifest_path, "splits": result.split_records()}))
    return 0


if __name__ == "__main__":
    from effnet_common import quick_exit

    quick_exit.exit_with(main())
