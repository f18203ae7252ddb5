"""The Beam stages with TestPipeline + assert_that, and the whole CLI on generated ILSVRC-style archives."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import apache_beam as beam
import pytest
import tensorflow as tf
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_preprocess import __main__ as cli
from beam_preprocess import layout, pipeline, processes, sources, spill, tfrecord
from effnet_common import schema
from effnet_common.manifest import Manifest


def _records(path):
    return [r.numpy() for r in tf.data.TFRecordDataset(path)]


def _parse(record):
    feature = tf.train.Example.FromString(record).features.feature
    return {
        "filename": feature[schema.FILENAME].bytes_list.value[0].decode(),
        "synset": feature[schema.SYNSET].bytes_list.value[0].decode(),
        "label": feature[schema.LABEL].int64_list.value[0],
        "jpeg": feature[schema.IMAGE_ENCODED].bytes_list.value[0],
    }


@pytest.mark.parametrize(
    "records,shards", [(10, 3), (1252 * 4 + 3, 4), (7, 7), (5, 8), (0, 2), (1_281_167, 1024)]
)
def test_balanced_bounds_cover_every_record_once_with_sizes_within_one(records, shards):
    bounds = layout.balanced_bounds(records, shards)
    assert len(bounds) == shards and bounds[0][0] == 0 and bounds[-1][1] == records
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    sizes = [end - start for start, end in bounds]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    "total_mb,requested,shard_mb,hosts,expected",
    [
        (1000, 0, 128, 1, 8),
        (1000, 0, 128, 4, 8),
        (1000, 0, 128, 3, 9),
        (1, 0, 128, 4, 4),
        (1000, 64, 128, 4, 64),
    ],
)
def test_shard_count_is_a_multiple_of_hosts(total_mb, requested, shard_mb, hosts, expected):
    assert layout.choose_num_shards(total_mb * 2**20, requested, shard_mb, hosts) == expected


@pytest.mark.parametrize("worker_processes", [0, 2])
def test_process_unit_spills_examples_and_reports_failures(quirky_archives, tmp_path, worker_processes):
    """The same outputs whether the Beam worker checks its units itself or hands them to worker processes
    (several units in flight, the last ones yielded at the bundle's end)."""
    spec = sources.InputSpec(schema.VALIDATION, sources.KIND_VAL_ARCHIVE, quirky_archives.val_archive)
    units = list(sources.plan_units(spec, members_per_unit=3 if worker_processes else 1000))
    expected_names = sorted(quirky_archives.validation)
    with TestPipeline() as p:
        outputs = (
            p
            | beam.Create(units)
            | beam.ParDo(
                pipeline.ProcessUnitFn(str(tmp_path), seed=0, worker_processes=worker_processes)
            ).with_outputs(pipeline.ProcessUnitFn.FAILURES, pipeline.ProcessUnitFn.STATS, main="spills")
        )
        # One spill per unit; the validation names travel in their sorted order, images never do.
        names = outputs.spills | "Names" >> beam.FlatMap(lambda spill: spill.keys)
        assert_that(names, equal_to(expected_names), label="EveryGoodImage")
        reasons = outputs.failures | beam.Map(lambda f: (f.source.split("[")[-1].rstrip("]"), f.reason[:14]))
        truncated = next(n for n, what in quirky_archives.bad.items() if what == "truncated" and "val" in n)
        assert_that(
            reasons,
            equal_to([(truncated, "does not decod"), ("not_an_official_name.JPEG", "'not_an_offici")]),
            label="Failures",
        )
        counts = outputs.stats | beam.MapTuple(
            lambda split, stats, classes: [stats.get(k, 0) for k in ("read", "failed", "fixed_grayscale")]
        )
        summed = counts | "SumStats" >> beam.CombineGlobally(_column_sums)
        assert_that(summed, equal_to([[len(expected_names) + 2, 2, 1]]), label="Stats")
        located = (
            outputs.spills
            | "CheckEntries" >> beam.Map(_check_spill_entries)
            | "SumEntries" >> beam.CombineGlobally(_column_sums)
        )
        # Every untouched image is located in the archive; only the re-encoded grayscale one is in the spill.
        assert_that(located, equal_to([[len(expected_names) - 1, 1]]), label="Entries")
    processes.close_shared_pools()
    spills = os.listdir(tmp_path / schema.VALIDATION)
    assert len(spills) == len(units) and all(name.endswith(".spill") for name in spills)


def _column_sums(rows) -> list[int]:
    return [sum(column) for column in zip(*rows, strict=True)]


def _check_spill_entries(unit_spill):
    """The spill's index rebuilds each Example, in the order of the spill's keys (sorted names), from the
    archive's bytes or the spill's own; returns (images in the archive, images in the spill)."""
    with open(unit_spill.path, "rb") as f:
        data = f.read()
    with open(unit_spill.source, "rb") as f:
        archive = f.read()
    in_archive = in_spill = 0
    for rank, key in enumerate(unit_spill.keys):
        at, size = unit_spill.index_range(rank)
        entry = spill.decode_entry(data[at : at + size])
        where = archive if entry.in_source else data
        image = where[entry.image_at : entry.image_at + entry.image_len]
        record = entry.pre + image + entry.post
        assert _parse(record)["filename"] == key and _parse(record)["jpeg"] == image
        assert tfrecord.masked_crc_value([record]) == entry.crc
        in_archive, in_spill = in_archive + entry.in_source, in_spill + (not entry.in_source)
    assert unit_spill.index_at + unit_spill.entry_size * unit_spill.count == len(data)
    return in_archive, in_spill


def _run_cli(args):
    return cli.main([str(a) for a in args])


def _digest(directory):
    digests = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digests[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return digests


@pytest.fixture(scope="module")
def quirky_run(quirky_archives, tmp_path_factory):
    out = tmp_path_factory.mktemp("quirky_run")
    code = _run_cli(
        [
            "--train-archive", quirky_archives.train_archive,
            "--val-archive", quirky_archives.val_archive,
            "--output-dir", out,
            "--num-hosts", 2,
            "--train-shards", 6,
            "--val-shards", 4,
            "--members-per-unit", 100,
            "--max-failures", 100,
        ]
    )  # fmt: skip
    assert code == 0
    with open(out / "manifest.json") as f:
        return out, json.load(f)


def test_end_to_end_every_image_accounted_for(quirky_archives, quirky_run):
    out, manifest = quirky_run
    for split, expected in (
        (schema.TRAIN, quirky_archives.train),
        (schema.VALIDATION, quirky_archives.validation),
    ):
        info = manifest["splits"][split]
        paths = sorted(tf.io.gfile.glob(str(out / split / f"{split}-*-of-*")))
        assert [os.path.relpath(p, out) for p in paths] == [s["path"] for s in info["shards"]]
        parsed = [_parse(r) for path in paths for r in _records(path)]
        assert {e["filename"]: e["synset"] for e in parsed} == expected
        assert all(e["label"] == schema.synset_to_label()[e["synset"]] for e in parsed)
        assert info["records"] == len(parsed) == len(expected)
        assert info["read"] == info["records"] + info["failed"]
        assert sum(info["class_counts"].values()) == len(parsed)
        # Quirks became RGB JPEGs.
        for e in parsed:
            assert e["jpeg"][:2] == b"\xff\xd8", e["filename"]
        assert all(
            tf.io.decode_jpeg(e["jpeg"]).shape[-1] == 3
            for e in parsed
            if e["filename"] in quirky_archives.fixed
        )
    assert manifest["splits"][schema.TRAIN]["fixed"] == {"png": 1, "cmyk": 1, "grayscale": 1, "other_mode": 0}
    assert manifest["splits"][schema.VALIDATION]["fixed"]["grayscale"] == 1
    # Every bad input is named in the failures with its reason.
    sources_failed = " ".join(f["source"] for f in manifest["failures"])
    for name in quirky_archives.bad:
        assert name in sources_failed, name
    total_failed = sum(info["failed"] for info in manifest["splits"].values())
    assert len(manifest["failures"]) == total_failed == len(quirky_archives.bad)
    assert not os.path.exists(out / ".beam_preprocess-tmp")


def test_shards_are_balanced_and_a_multiple_of_hosts(quirky_run):
    _, manifest = quirky_run
    for info in manifest["splits"].values():
        counts = [s["records"] for s in info["shards"]]
        assert len(counts) % 2 == 0
        assert max(counts) - min(counts) <= 1


def test_validation_shards_keep_sorted_order_and_train_is_shuffled(quirky_run):
    out, manifest = quirky_run
    val = [
        _parse(r)["filename"]
        for s in manifest["splits"]["validation"]["shards"]
        for r in _records(out / s["path"])
    ]
    assert val == sorted(val)
    train = [
        _parse(r)["filename"]
        for s in manifest["splits"]["train"]["shards"]
        for r in _records(out / s["path"])
    ]
    assert train != sorted(train)
    first_shard_synsets = {
        _parse(r)["synset"] for r in _records(out / manifest["splits"]["train"]["shards"][0]["path"])
    }
    assert len(first_shard_synsets) >= 8  # classes are mixed across shards, not one per shard


def test_rerun_writes_byte_identical_shards(quirky_archives, quirky_run, tmp_path):
    out, _ = quirky_run
    # A second run with 2 multi-process DirectRunner workers, same input and options.
    code = _run_cli(
        [
            "--train-archive", quirky_archives.train_archive,
            "--val-archive", quirky_archives.val_archive,
            "--output-dir", tmp_path,
            "--num-hosts", 2,
            "--train-shards", 6,
            "--val-shards", 4,
            "--members-per-unit", 100,
            "--max-failures", 100,
            "--direct_num_workers", 2,
            "--direct_running_mode", "multi_processing",
        ]
    )  # fmt: skip
    assert code == 0
    first, second = _digest(out), _digest(tmp_path)
    first.pop("manifest.json"), second.pop("manifest.json")
    assert first == second and len(first) == 10


def test_failure_budget_exceeded_exits_2_naming_the_inputs(quirky_archives, tmp_path, capsys):
    code = _run_cli(
        ["--train-archive", quirky_archives.train_archive, "--output-dir", tmp_path, "--max-failures", 2]
    )
    err = capsys.readouterr().err
    assert code == 2  # unusable inputs are bad input, as in every command
    # One line on the console; the inputs that failed are listed in the log file beside the output.
    assert err.count("\n") == 1 and "more than --max-failures=2" in err
    log = (tmp_path.parent / f"{tmp_path.name}.beam_preprocess.log").read_text()
    assert "n99999999.tar" in log and "empty file" in log
    # The failed run's manifest still lists every failure for inspection, under a name no reader takes for a
    # finished run's, and its shards are gone.
    assert not (tmp_path / "manifest.json").exists()
    with open(tmp_path / "manifest.failed.json") as f:
        assert len(json.load(f)["failures"]) == 6
    assert not list(tmp_path.rglob("*-of-*"))


def test_existing_output_is_not_mixed_without_overwrite(clean_archives, tmp_path, capsys):
    args = ["--val-archive", clean_archives.val_archive, "--output-dir", tmp_path, "--val-shards", 2]
    assert _run_cli(args) == 0
    assert _run_cli(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert _run_cli([*args[:-1], 3, "--overwrite"]) == 0
    assert sorted(os.listdir(tmp_path / "validation")) == [f"validation-0000{i}-of-00003" for i in range(3)]


@pytest.mark.parametrize(
    "args,message",
    [
        # Named as the flags that set them.
        (
            ["--num-hosts", "4", "--train-shards", "6"],
            "error: --train-shards=6 must be a multiple of --num-hosts=4",
        ),
        (["--shard-mb", "0"], "error: --shard-mb must be positive"),
        (["--train-dir", "x"], "error: give --train-archive or --train-dir, not both"),
    ],
)
def test_bad_options_get_a_clear_error(clean_archives, tmp_path, capsys, args, message):
    code = _run_cli(["--train-archive", clean_archives.train_archive, "--output-dir", tmp_path, *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_tfds_prepared_imagenet_is_resharded(clean_archives, tmp_path, monkeypatch):
    import tensorflow_datasets as tfds

    # The builder of a dataset not yet prepared makes a directory in the system's temporary directory for
    # metadata it would fetch from tensorflow-datasets' bucket, and never removes it: here it is the test's.
    (tmp_path / "tmp").mkdir()
    with monkeypatch.context() as m:
        m.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
        builder = tfds.builder("imagenet2012", data_dir=str(tmp_path / "tfds"))
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(
                manual_dir=os.path.dirname(clean_archives.train_archive)
            )
        )
    out = tmp_path / "out"
    assert _run_cli(["--tfds-data-dir", tmp_path / "tfds", "--output-dir", out, "--num-hosts", 2]) == 0
    with open(out / "manifest.json") as f:
        manifest = json.load(f)
    # tensorflow-datasets labels validation images by zipping the sorted member names with the official list,
    # which assumes all 50,000 are present: on a partial archive its labels differ from the official ones.
    # Resharding keeps the labels the tfds copy holds.
    tfds_validation = dict(zip(sorted(clean_archives.validation), schema.validation_synsets(), strict=False))
    for split, expected in ((schema.TRAIN, clean_archives.train), (schema.VALIDATION, tfds_validation)):
        parsed = [_parse(r) for s in manifest["splits"][split]["shards"] for r in _records(out / s["path"])]
        assert {e["filename"]: e["synset"] for e in parsed} == expected
        assert manifest["splits"][split]["num_shards"] == 2


def test_cli_help_lists_inputs_and_beam_options():
    result = subprocess.run(
        [sys.executable, "-m", "beam_preprocess", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    for flag in (
        "--train-archive",
        "--val-archive",
        "--train-dir",
        "--tfds-data-dir",
        "--num-hosts",
        "--shard-mb",
    ):
        assert flag in result.stdout
    assert "DataflowRunner" in result.stdout


def test_validation_given_as_class_directories_is_merged_in_name_order(clean_archives, tmp_path):
    import tarfile

    # val/<wnid>/ directories: every unit's names interleave with every other's, so the layout merges them.
    with tarfile.open(clean_archives.val_archive) as val:
        for member in val.getmembers():
            target = tmp_path / "val" / clean_archives.validation[member.name]
            target.mkdir(parents=True, exist_ok=True)
            (target / member.name).write_bytes(val.extractfile(member).read())
    out = tmp_path / "out"
    assert _run_cli(["--val-dir", tmp_path / "val", "--output-dir", out, "--num-hosts", 3]) == 0
    manifest = Manifest.read(str(out / "manifest.json"))
    shards = manifest.split(schema.VALIDATION).shards
    names = [[_parse(r)["filename"] for r in _records(s.path)] for s in shards]
    assert [n for shard in names for n in shard] == sorted(clean_archives.validation)
    assert len(names) == 3 and max(map(len, names)) - min(map(len, names)) <= 1


def test_failed_run_says_in_one_line_where_its_leftovers_are(clean_archives, tmp_path, caplog):
    # A file where the train split directory should be: shards cannot be written after the spill was.
    (tmp_path / "train").write_text("in the way")
    with pytest.raises(Exception, match="train"):
        _run_cli(["--train-archive", clean_archives.train_archive, "--output-dir", tmp_path])
    (line,) = [r.getMessage() for r in caplog.records if "did not finish" in r.getMessage()]
    assert f"spill files are left under {tmp_path / '.beam_preprocess-tmp'}" in line
    assert os.listdir(tmp_path / ".beam_preprocess-tmp" / "train")
    # A rerun without --overwrite refuses to mix with the leftovers; with it, they are cleared.
    (tmp_path / "train").unlink()
    args = ["--train-archive", clean_archives.train_archive, "--output-dir", tmp_path]
    assert _run_cli(args) == 2
    assert _run_cli([*args, "--overwrite"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["manifest.json", "train"]


def test_an_archive_changed_between_checking_and_writing_fails_in_one_line(
    clean_archives, tmp_path, monkeypatch, capsys
):
    import shutil
    import tarfile

    # Shard writers read untouched images again from the archive: one replaced after its images were checked
    # must not end up in the shards unchecked. One byte of an image changes once every unit is checked.
    archive = shutil.copy(clean_archives.val_archive, tmp_path / "ILSVRC2012_img_val.tar")
    with tarfile.open(archive) as tar:
        member = tar.getmembers()[5]
    laid_out = pipeline.build_layouts

    def change_then_lay_out(spills, config):  # every unit is checked by then (the layout waits for them all)
        with open(archive, "r+b") as f:
            f.seek(member.offset_data + member.size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        return laid_out(spills, config)

    monkeypatch.setattr(pipeline, "build_layouts", change_then_lay_out)
    out = tmp_path / "out"
    assert _run_cli(["--val-archive", archive, "--output-dir", out, "--direct_num_workers", 1]) == 1
    changed, leftovers = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert changed.startswith(f"error: {archive} changed while the run was going: the {member.size} bytes at")
    assert leftovers.startswith("error: beam_preprocess did not finish: its spill files are left under")
    assert not (out / "manifest.json").exists()


def _group_processes(group: int) -> list[str]:
    """The live processes of process group ``group``: pid, parent, state and command line of each (what a
    failed assertion needs to tell a process still tearing down from one left running)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.isdigit() and fields[0] != "Z" and int(fields[2]) == group:
            found.append(f"pid {entry} parent {fields[1]} state {fields[0]}: {command!r}")
    return found


@pytest.mark.parametrize(
    "mode",
    [pytest.param("multi_processing", marks=pytest.mark.slow), "multi_threading"],  # Beam's processes: 26 s
)
def test_ctrl_c_while_the_workers_shard_removes_everything_and_stops_them(clean_archives, tmp_path, mode):
    """SIGINT to the command's process group (a terminal's Ctrl-C) while its workers (Beam's worker processes, or
    threads of the command) spill: one line, exit 130, no process left, no spill file, shard or temporary
    directory left, so the same command then runs without --overwrite."""
    out = tmp_path / "shards"
    argv = [sys.executable, "-m", "beam_preprocess", "--train-archive", clean_archives.train_archive]
    argv += ["--val-archive", clean_archives.val_archive, "--output-dir", str(out), "--check-threads", "1"]
    argv += ["--direct_num_workers", "2", "--direct_running_mode", mode]
    (tmp_path / "tmp").mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path / "tmp"),
    }  # where Beam makes the pipeline's temporary directory
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    try:
        assert process.stdout.readline().startswith("full log: ")
        while not (out / ".beam_preprocess-tmp").exists() and process.poll() is None:
            time.sleep(0.01)
        assert process.poll() is None, "the run ended before its workers spilled anything"
        os.killpg(process.pid, signal.SIGINT)
        out_text, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, err
    assert err == (
        f"stopped by the user: the partial shards and spill files under {out} were removed (the log "
        f"{out}.beam_preprocess.log is kept); run the same command again\n"
    )
    assert "Traceback" not in out_text and not [p for p in out.rglob("*") if p.is_file()]
    assert list((tmp_path / "tmp").iterdir()) == []
    assert _group_processes(process.pid) == []
    assert subprocess.run(argv, capture_output=True, timeout=600).returncode == 0
