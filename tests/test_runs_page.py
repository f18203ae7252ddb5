"""The page of a pipeline root's runs (pipeline/runs_page.py): its rows, kept as JSON lines, and the page drawn from
them, newest first, escaped, with failed and stopped runs, goodput, rows written before a field was added and
broken lines; and the page in a real browser.
The local runner's hook is checked end to end by tests/test_pipeline.py's local runs."""

import dataclasses
import json
import os
import re
import shutil
import struct
import subprocess

import pytest
from PIL import Image

from effnet_common import stopping
from effnet_common.goodput import Span, TimeAccount
from pipeline import runs_page
from pipeline.outcome import Outcome

WINDOW = (1400, 900)


def _row(preset="demo", started=1_800_000_000.0, **fields) -> runs_page.Row:
    return runs_page.Row(preset, fields.pop("target_top1", 0.9), started=started, **fields)


def _table_rows(page: str) -> list[str]:
    return re.findall(r"<tr><td>.*?</tr>", page, re.S)


def _finished_row(root, **fields) -> runs_page.Row:
    """A blessed, pushed run whose report and TensorBoard logs lie under ``root``."""
    model_run = f"{root}/artifacts/effnet-demo/Trainer/model_run/7"
    values = dict(
        top1=0.9583,
        top5=0.9972,
        blessed=True,
        epochs=30.0,
        training_seconds=95.0,
        goodput=0.41,
        time_account_line="goodput 41% of 3m52s: 1m20s between pipeline steps, 35.0s trace and compile",
        pushed_destination=f"{root}/serving_model/effnet-demo/1800000123",
        report=f"{model_run}/report.html",
        tensorboard=f"tensorboard --logdir {model_run}/tensorboard",
    )
    return _row(**{**values, **fields})


def test_rows_are_appended_as_json_lines_and_the_page_lists_them_newest_first(tmp_path):
    root = str(tmp_path)
    for preset, started in (("demo", 100.0), ("smoke", 300.0), ("b0", 200.0)):
        page = runs_page.add(root, _row(preset, started))
    assert page == f"{root}/runs/index.html"
    lines = (tmp_path / "runs" / "runs.jsonl").read_text().splitlines()
    assert [json.loads(line)["preset"] for line in lines] == ["demo", "smoke", "b0"]  # in the order added
    rows, skipped = runs_page.parse_rows("\n".join(lines))
    assert rows[0] == _row("demo", 100.0) and skipped == []
    shown = [
        re.search(r"<td>\S+ \S+</td><td>(\w+)</td>", row).group(1) for row in _table_rows(open(page).read())
    ]
    assert shown == ["smoke", "b0", "demo"]
    assert sorted(os.listdir(tmp_path / "runs")) == ["index.html", "runs.jsonl"]  # nothing temporary left


def test_a_finished_row_shows_the_verdict_numbers_version_and_relative_links(tmp_path):
    root = str(tmp_path)
    page = tmp_path / "runs" / "index.html"
    runs_page.add(root, _finished_row(root))
    (row,) = _table_rows(page.read_text())
    cells = re.findall(r"<td>(.*?)</td>", row, re.S)
    assert cells[1:7] == ["demo", "0.9000", "0.9583", "0.9972", "30.00", "1m35s"]
    assert cells[7].startswith('<span title="goodput 41% of 3m52s: ') and cells[7].endswith(">41%</span>")
    assert '<span class="blessed">blessed</span>' in cells[8]
    assert f'title="{root}/serving_model/effnet-demo/1800000123">1800000123</span>' in cells[9]
    assert cells[10] == '<a href="../artifacts/effnet-demo/Trainer/model_run/7/report.html">report</a>'
    assert (
        f"<code>tensorboard --logdir {root}/artifacts/effnet-demo/Trainer/model_run/7/tensorboard</code>"
        in cells[11]
    )
    # The link leads to the report from the page's directory.
    href = re.search(r'href="([^"]+)"', cells[10]).group(1)
    assert (
        os.path.normpath(tmp_path / "runs" / href)
        == f"{root}/artifacts/effnet-demo/Trainer/model_run/7/report.html"
    )


def test_goodput_has_a_column_of_its_own_as_a_percentage_with_the_one_line_account_as_its_title(tmp_path):
    line = 'goodput 41% of 3m52s: 1m20s between pipeline steps, 35.0s "trace" & compile'
    page = runs_page.render([_row(goodput=0.4123, time_account_line=line)], str(tmp_path))
    headings = re.findall(r"<th>(.*?)</th>", page)
    cells = re.findall(r"<td>(.*?)</td>", _table_rows(page)[0], re.S)
    assert len(cells) == len(headings) and headings[7] == "goodput"
    assert cells[7] == (
        '<span title="goodput 41% of 3m52s: 1m20s between pipeline steps, '
        '35.0s &quot;trace&quot; &amp; compile">41%</span>'
    )
    # Without the line, the share alone; without goodput, an empty cell.
    with_share, empty = _table_rows(
        runs_page.render([_row(started=2.0, goodput=1.0), _row(started=1.0)], str(tmp_path))
    )
    assert re.findall(r"<td>(.*?)</td>", with_share, re.S)[7] == "100%"
    assert re.findall(r"<td>(.*?)</td>", empty, re.S)[7] == ""


def test_a_row_written_before_the_goodput_column_parses_and_shows_an_empty_cell(tmp_path):
    rows_file = tmp_path / "runs" / "runs.jsonl"
    rows_file.parent.mkdir()
    old = dataclasses.asdict(_finished_row(str(tmp_path)))
    del old["goodput"], old["time_account_line"]
    rows_file.write_text(json.dumps(old) + "\n")
    page = open(runs_page.add(str(tmp_path), _row("smoke", started=1_900_000_000.0, goodput=0.5))).read()
    rows, skipped = runs_page.parse_rows(rows_file.read_text())
    assert skipped == [] and [(row.preset, row.goodput, row.time_account_line) for row in rows] == [
        ("demo", None, None),
        ("smoke", 0.5, None),
    ]
    new, before = _table_rows(page)  # newest first
    assert re.findall(r"<td>(.*?)</td>", new, re.S)[7] == "50%"
    assert re.findall(r"<td>(.*?)</td>", before, re.S)[7] == ""


def test_a_refused_run_says_why_and_a_report_outside_the_root_is_linked_absolutely(tmp_path):
    row = _finished_row(
        "/elsewhere",
        blessed=False,
        why_not="top-1 0.9583 is below the target 0.9600",
        pushed_destination=None,
        report="/elsewhere/my run/report.html",
    )
    page = runs_page.render([row], str(tmp_path))
    assert '<span class="refused">not blessed: top-1 0.9583 is below the target 0.9600</span>' in page
    assert '<a href="file:///elsewhere/my%20run/report.html">report</a>' in page
    assert "gs://b/run/report.html" in runs_page.render(
        [_row(report="gs://b/run/report.html")], str(tmp_path)
    )


def test_every_text_of_a_row_is_escaped(tmp_path):
    row = _finished_row(
        str(tmp_path),
        preset="<b>demo</b>",
        blessed=False,
        why_not='<script>alert("x")</script> & more',
        report=f"{tmp_path}/a dir/<r>&.html",
        tensorboard="tensorboard --logdir '<d>'",
    )
    page = runs_page.render([row], "<root & co>")
    assert "<script>" not in page and "<b>" not in page and "<r>" not in page and "<d>" not in page
    assert "&lt;b&gt;demo&lt;/b&gt;" in page and "&lt;root &amp; co&gt;" in page
    assert "not blessed: &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more" in page
    assert "tensorboard --logdir &#x27;&lt;d&gt;&#x27;" in page


def test_a_failed_run_adds_its_row_with_the_errors_first_line(tmp_path):
    root = str(tmp_path)
    with pytest.raises(RuntimeError, match="out of memory"):
        with runs_page.unfinished(root, _row()):
            raise RuntimeError("the Trainer failed: out of memory:\nTraceback (most recent call last): ...")
    rows, _ = runs_page.parse_rows((tmp_path / "runs" / "runs.jsonl").read_text())
    assert [(row.state, row.why_not, row.top1) for row in rows] == [
        (runs_page.FAILED, "the Trainer failed: out of memory", None)
    ]
    page = (tmp_path / "runs" / "index.html").read_text()
    assert '<span class="failed">failed: the Trainer failed: out of memory</span>' in page


def test_a_stopped_run_adds_its_row_from_the_stops_clean_up(tmp_path):
    """Ctrl-C runs the clean-ups registered inside the block from the stopping thread, and never unwinds it."""
    root = str(tmp_path)
    with runs_page.unfinished(root, _row()):
        stopping.run_cleanups()
    rows, _ = runs_page.parse_rows((tmp_path / "runs" / "runs.jsonl").read_text())
    assert [row.state for row in rows] == [runs_page.STOPPED]
    assert (
        f'<span class="stopped">{stopping.STOPPED}</span>' in (tmp_path / "runs" / "index.html").read_text()
    )
    with runs_page.unfinished(root, _row()):
        pass  # a run that ended its block normally adds its row itself (``finished``), not here
    assert len((tmp_path / "runs" / "runs.jsonl").read_text().splitlines()) == 1


def test_broken_lines_are_left_out_with_a_warning_and_a_note(tmp_path, caplog):
    rows_file = tmp_path / "runs" / "runs.jsonl"
    rows_file.parent.mkdir()
    good = json.dumps({"preset": "demo", "target_top1": 1, "started": 5})  # JSON's integers stand for floats
    broken = [
        "not json",
        "[1, 2]",
        json.dumps({"preset": "demo", "target_top1": "high", "started": 5.0}),
        json.dumps({"preset": "demo", "target_top1": 0.9}),  # no start time
        json.dumps({"preset": "demo", "target_top1": 0.9, "started": 5.0, "colour": "red"}),
        json.dumps({"preset": "demo", "target_top1": 0.9, "started": 5.0, "top1": True}),
        json.dumps({"preset": "demo", "target_top1": 0.9, "started": 5.0, "state": "exploded"}),
    ]
    rows_file.write_text("\n".join([good, *broken, "", '{"preset": "cut sh']))  # a last line cut short
    with caplog.at_level("WARNING", logger=runs_page.__name__):
        page = open(runs_page.add(str(tmp_path), _row("smoke"))).read()
    assert len(_table_rows(page)) == 2 and "smoke" in page
    assert "left out line(s) 2, 3, 4, 5, 6, 7, 8, 10, which are not rows of a run" in page
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == 8 and all(message.startswith("runs.jsonl line ") for message in warned)
    assert (
        rows_file.read_text().splitlines()[-2] == '{"preset": "cut sh'
    )  # kept as it was, the new row after it


def test_a_finished_row_takes_the_outcome_and_the_trainers_last_evaluation(tmp_path):
    model_run = tmp_path / "model_run"
    model_run.mkdir()
    history = [
        {"step": 10, "epoch": 12.5, "elapsed_seconds": 40.0},
        {"step": 20, "epoch": 25.0, "elapsed_seconds": 81.5},
    ]
    (model_run / "metrics.json").write_text(json.dumps({"history": history}))
    result = Outcome(
        target_top1=0.96,
        top1=0.9412,
        top5=0.99,
        blessed=False,
        pushed=False,
        pushed_destination=f"{tmp_path}/serving_model/effnet-demo/1",  # an earlier push
        model_uri=None,
        model_run_uri=str(model_run),
        refusals=(
            "top-1 0.9412 is below the target 0.9600",
            "its top-1 is 0.0100 below the last blessed model's",
        ),
    )
    row = runs_page.finished(_row(target_top1=0.96), result, "r.html", "tb", pushed_before=True)
    assert (row.top1, row.top5, row.epochs, row.training_seconds) == (0.9412, 0.99, 25.0, 81.5)
    assert (row.goodput, row.time_account_line) == (None, None)  # no time account given
    assert (row.blessed, row.pushed_destination, row.pushed_before) == (False, None, False)
    assert (
        row.why_not
        == "top-1 0.9412 is below the target 0.9600; its top-1 is 0.0100 below the last blessed model's"
    )
    assert (row.report, row.tensorboard, row.state) == ("r.html", "tb", runs_page.FINISHED)


def test_a_finished_row_takes_the_goodput_of_the_runs_time_account(tmp_path):
    model_run = tmp_path / "model_run"
    model_run.mkdir()
    spans = [Span(10.0, 20.0, "TRAINING_PREP"), Span(20.0, 61.0, "GOODPUT"), Span(61.0, 110.0, "EXPORT")]
    account = TimeAccount.of(spans, 10.0, 110.0)
    history = [{"step": 20, "epoch": 25.0, "elapsed_seconds": 81.5}]
    (model_run / "metrics.json").write_text(json.dumps({"history": history}))
    result = Outcome(
        target_top1=0.96,
        top1=0.97,
        top5=0.99,
        blessed=True,
        pushed=True,
        pushed_destination=f"{tmp_path}/serving_model/effnet-demo/1",
        model_uri=None,
        model_run_uri=str(model_run),
        refusals=(),
    )
    row = runs_page.finished(_row(target_top1=0.96), result, None, None, pushed_before=False, account=account)
    assert row.goodput == 0.41 and row.epochs == 25.0
    assert row.time_account_line == "goodput 41% of 1m40s: 49.0s export, 10.0s training preparation"
    assert row.time_account_line == account.one_line()
    # As runs.jsonl keeps it.
    assert runs_page.Row.from_dict(json.loads(json.dumps(dataclasses.asdict(row)))) == row


def _png_size(path) -> tuple[int, int]:
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n", header
    return struct.unpack(">II", header[16:24])


def test_the_page_renders_in_headless_chromium(tmp_path):
    """Two runs, a blessed one and a refused one, drawn by a real browser: the screenshot has the window's size
    and holds the table (more than a blank page's few colours)."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not on PATH (Debian's package: apt-get install chromium)")
    root = str(tmp_path / "root")
    runs_page.add(root, _finished_row(root, started=1_800_000_000.0))
    refused = dict(blessed=False, why_not="top-1 0.9412 is below the target 0.9600", pushed_destination=None)
    page = runs_page.add(
        root, _finished_row(root, started=1_800_000_200.0, target_top1=0.96, top1=0.9412, **refused)
    )
    screenshot = tmp_path / "runs.png"
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    command += [f"--screenshot={screenshot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", f"file://{page}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and screenshot.exists(), done.stderr[-3000:]
    assert _png_size(screenshot) == WINDOW and screenshot.stat().st_size > 20_000
    with Image.open(screenshot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # text antialiased in several colours, not a blank page
