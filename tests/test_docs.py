"""The documentation cannot drift from the code: README.md and the guides in docs/.

- Every command that runs one of the project's programs, in a ```bash block or quoted inline, takes the flags it
  is given: each flag is looked up in that program's own argparse parser (built as the program builds it, before
  its heavy imports; for ``python -m beam_preprocess`` the rest goes to Beam's parser, as the command hands it on;
  a benchmark's flags are the ones its script declares), and a preset or accelerator it names exists.
- Every relative link resolves, to a file and to a heading's anchor (GitHub's slugs, which the site's toc uses
  too: mkdocs.yml). README.md links into docs/ and the guides stay inside docs/ (or link back to README.md), so
  the links work alike on GitHub and on the site.
- Every one-line message docs/troubleshooting.md lists (``error: ...`` and the like, in its code) is one the
  code prints: its fixed parts (``{placeholders}`` and ``…`` left out) are covered by the string literals of the
  project's Python files and the tests' expected messages.
- The site builds (MkDocs, Material theme) with broken links and anchors as errors.

No TensorFlow and no network: only the parsers, the files and MkDocs.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import suite_env

REPO = pathlib.Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = (README, *sorted(DOCS.glob("*.md")))
TROUBLESHOOTING = DOCS / "troubleshooting.md"

# The front page stays a front page (issue 47), and links a guide for each task.
README_MAX_LINES = 160
GUIDES = (
    "sharding.md", "training.md", "tuning.md", "local-pipeline.md", "vertex.md", "kubeflow.md", "paper-runs.md",
    "serving.md", "performance.md", "troubleshooting.md", "architecture.md", "status.md",
)  # fmt: skip


# ---- Markdown: code blocks, headings, links ---------------------------------------------------------------

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<language>[\w+-]*)")


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced code block: its language and its lines, the first at ``first_line`` (1-based) of ``path``."""

    path: pathlib.Path
    language: str
    first_line: int
    lines: tuple[str, ...]


def _name(path: pathlib.Path) -> str:
    return str(path.relative_to(REPO))


def code_blocks(path: pathlib.Path) -> list[Block]:
    blocks, opened = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE.match(line)
        if opened is None:
            if match:
                opened = (match["indent"], match["fence"], match["language"], number + 1, [])
            continue
        indent, fence, language, first, lines = opened
        if (
            match
            and match["fence"][0] == fence[0]
            and len(match["fence"]) >= len(fence)
            and not match["language"]
        ):
            blocks.append(Block(path, language, first, tuple(lines)))
            opened = None
        else:
            lines.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
    assert opened is None, f"{_name(path)}:{opened[3] - 1}: a code block is never closed"
    return blocks


def outside_code_blocks(path: pathlib.Path) -> list[str]:
    """The file's lines with fenced code blanked out (line numbers kept)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for block in code_blocks(path):
        for index in range(block.first_line - 2, block.first_line + len(block.lines)):
            lines[index] = ""
    return lines


def prose(path: pathlib.Path) -> list[str]:
    """The file's lines outside code: fenced code blanked out, inline code spans removed."""
    return [re.sub(r"(`+)(?:(?!\1).)+?\1", "", line) for line in outside_code_blocks(path)]


HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (and the site's: pymdownx.slugs.slugify, case lower)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(path: pathlib.Path) -> tuple[str, ...]:
    return tuple(slug(m[2]) for line in outside_code_blocks(path) if (m := HEADING.match(line)))


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(path: pathlib.Path) -> list[tuple[int, str]]:
    return [(number, m[1]) for number, line in enumerate(prose(path), 1) for m in LINK.finditer(line)]


# ---- the project's programs and their flags -----------------------------------------------------------------

MODULES = {
    "beam_preprocess": "python -m beam_preprocess",
    "beam_preprocess.sample_data": "python -m beam_preprocess.sample_data",
    "trainer_module": "python -m trainer_module",
    "pipeline.local_runner": "python -m pipeline.local_runner",
    "pipeline.kubeflow_v2_runner": "python -m pipeline.kubeflow_v2_runner",
}
# scripts/demo.sh runs the local runner with the arguments it is given.
SCRIPTS = {"scripts/demo.sh": "pipeline.local_runner"}
# Words that start a command and run the next word as the command.
WRAPPERS = ("nice", "env", "time", "exec", "sudo")
SHELL_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ">", ">>", "<", "<<", "|&", ";;"}
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*|.*(\$|\.\.\.|…|<|\{).*")
NUMBER = re.compile(r"-\d")


INLINE_CODE = re.compile(r"(`+)((?:(?!\1).)+?)\1", re.S)
# An inline code span that is a command of the project's programs.
INLINE_COMMAND = re.compile(
    r"^(\S*python[\d.]* +-m +(beam_preprocess|trainer_module|pipeline)|\S*scripts/demo\.sh|(\S*python[\d.]* +)?benchmarks/)"
)


@dataclasses.dataclass(frozen=True)
class Invocation:
    where: str  # file:line
    program: str  # a key of MODULES, or a benchmark's path
    args: tuple[str, ...]


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """A shell block's commands: continuation lines joined, each with the line it starts on."""
    found, parts, start = [], [], None
    for offset, line in enumerate(block.lines):
        start = block.first_line + offset if start is None else start
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        found.append((start, " ".join([*parts, line])))
        parts, start = [], None
    if parts:
        found.append((start, " ".join(parts)))
    return found


def shell_words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def invocations(block: Block) -> list[Invocation]:
    found = []
    for number, line in logical_lines(block):
        where = f"{_name(block.path)}:{number}"
        try:
            words = shell_words(line)
        except ValueError as error:  # unbalanced quotes: no shell would run it either
            if any(name in line for name in (*MODULES, *SCRIPTS, "benchmarks/")):
                pytest.fail(f"{where}: cannot read the command ({error}): {line.strip()}")
            continue
        segment: list[str] = []
        for word in [*words, ";"]:
            if word not in SHELL_OPERATORS:
                segment.append(word)
                continue
            invocation = _invocation(where, segment)
            if invocation:
                found.append(invocation)
            segment = []
    return found


def _invocation(where: str, words: list[str]) -> Invocation | None:
    while words and (re.fullmatch(r"\w+=.*", words[0]) or words[0] in WRAPPERS):
        words = words[1:]
    if not words:
        return None
    program, rest = words[0], words[1:]
    if re.fullmatch(r"(.*/)?python[\d.]*", program):
        if rest[:1] == ["-m"] and len(rest) > 1:
            return Invocation(where, rest[1], tuple(rest[2:])) if rest[1] in MODULES else None
        program, rest = (rest[0], rest[1:]) if rest else ("", [])
    program = program.removeprefix("./")
    if program in SCRIPTS:
        return Invocation(where, SCRIPTS[program], tuple(rest))
    if program.startswith("benchmarks/") and program.endswith(".py") and "*" not in program:
        return Invocation(where, program, tuple(rest))
    return None


@functools.cache
def parser_of(program: str) -> argparse.ArgumentParser:
    """The parser the program builds, as it builds it (none of these imports TensorFlow); a benchmark's from the
    ``add_argument`` calls its script makes (running one would import TensorFlow)."""
    if program == "beam_preprocess":
        from beam_preprocess import __main__ as cli
    elif program == "beam_preprocess.sample_data":
        from beam_preprocess import sample_data as cli
    elif program == "trainer_module":
        from trainer_module import __main__ as cli
    elif program == "pipeline.local_runner":
        from pipeline import local_runner as cli
    elif program == "pipeline.kubeflow_v2_runner":
        from pipeline import kubeflow_v2_runner as cli
    else:
        return _declared_parser(REPO / program)
    return cli.build_parser()


def _declared_parser(script: pathlib.Path) -> argparse.ArgumentParser:
    assert script.is_file(), f"{script.relative_to(REPO)}: no such script"
    parser = argparse.ArgumentParser(prog=str(script.relative_to(REPO)), conflict_handler="resolve")
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not names or not names[0].startswith("-"):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        action = keywords.get("action")
        action = action.value if isinstance(action, ast.Constant) else None
        nargs = keywords.get("nargs")
        if action in ("store_true", "store_false", "count"):
            parser.add_argument(*names, action=action)
        else:
            parser.add_argument(*names, nargs=nargs.value if isinstance(nargs, ast.Constant) else None)
    return parser


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


@functools.cache
def known_values() -> dict[str, frozenset[str]]:
    """Names a flag's value must be one of, beyond argparse's own choices."""
    from components import accelerators
    from trainer_module.presets import preset_names

    slices = frozenset(accelerators.ACCELERATORS.names())
    return {"--preset": frozenset(preset_names()), "--accelerator": slices, "--rehearse-slice": slices}


def scan(parser: argparse.ArgumentParser, args: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the problems: flags the parser does not take, values it refuses; the arguments left over: the flags it
    does not take with the words after them, for another parser)."""
    options, problems, rest = _options(parser), [], []
    words, after_unknown = list(args), False
    while words:
        word = words.pop(0)
        if word == "--":
            break
        if not word.startswith("-") or word == "-" or NUMBER.match(word):
            if after_unknown:
                rest.append(word)  # a value of an option that is not the parser's
            continue
        name, equals, value = word.partition("=")
        action = options.get(name)
        after_unknown = action is None
        if action is None:
            rest.append(word)
            continue
        values = [value] if equals else []
        if not equals and action.nargs not in (0, "?", "*"):
            count = action.nargs if isinstance(action.nargs, int) else 1
            values, words = words[:count], words[count:]
        elif not equals and action.nargs in ("?", "*") and words and not words[0].startswith("-"):
            values, words = words[:1], words[1:]
        problems += _refused_values(name, action, values)
    return problems, rest


def _refused_values(name: str, action: argparse.Action, values: list[str]) -> list[str]:
    allowed = known_values().get(name) or (
        frozenset(map(str, action.choices))
        if action.choices and not isinstance(action.choices, dict)
        else None
    )
    return [
        f"{name} {value}: not one of its values"
        for value in values
        if allowed and not PLACEHOLDER.fullmatch(value) and value not in allowed
    ]


def problems_of(invocation: Invocation) -> list[str]:
    parser, args = parser_of(invocation.program), invocation.args
    # The trainer's subcommands; its bare form is `train` (trainer_module.__main__.parse_args).
    if invocation.program == "trainer_module":
        from trainer_module import __main__ as cli

        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        if args and args[0] in cli.COMMANDS:
            parser, args = commands[args[0]], args[1:]
        elif not args or args[0] not in ("-h", "--help"):
            parser = commands["train"]
    problems, rest = scan(parser, args)
    if invocation.program == "beam_preprocess":  # what is not the command's own goes to Beam's parser
        from beam_preprocess import __main__ as cli

        unknown, _ = cli.beam_unknown_arguments(rest)
        rest = unknown
    refused = [word.partition("=")[0] for word in rest if word.startswith("-") and not NUMBER.match(word)]
    name = MODULES.get(invocation.program, f"python {invocation.program}")
    return [f"{flag}: not an option of {name}" for flag in refused] + problems


@functools.cache
def all_invocations() -> tuple[Invocation, ...]:
    """The commands of every shell block, and those quoted inline (`scripts/demo.sh --tune`, a benchmark's
    command beside its figure on the performance page)."""
    found = [
        invocation
        for page in PAGES
        for block in code_blocks(page)
        if block.language in ("bash", "sh", "shell", "console")
        for invocation in invocations(block)
    ]
    for page in PAGES:
        text = "\n".join(outside_code_blocks(page))
        for match in INLINE_CODE.finditer(text):
            command = " ".join(match[2].split())
            if INLINE_COMMAND.match(command):
                line = text.count("\n", 0, match.start()) + 1
                found += invocations(Block(page, "bash", line, (command,)))
    return tuple(found)


# ---- the tests ----------------------------------------------------------------------------------------------


def test_the_readme_is_a_front_page_that_starts_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move the details into docs/"
    # CI and a newcomer read these first: the demo, then the test suite.
    assert lines[2:6] == [
        "```bash",
        "scripts/demo.sh    # main job: the whole TFX pipeline on the embedded data -> a blessed, pushed EfficientNet",
        "scripts/test.sh    # test suite: ruff + pytest",
        "```",
    ]
    # Every guide is one click away from the front page.
    linked = {target.partition("#")[0] for _, target in links(README)}
    assert {f"docs/{name}" for name in GUIDES} - linked == set(), "README.md does not link these guides"


def test_every_command_of_the_docs_takes_the_flags_it_is_given():
    found = all_invocations()
    # The check sees the commands (a parsing slip would make it vacuous): each program appears in the docs.
    programs = {invocation.program for invocation in found}
    assert set(MODULES) <= programs, f"no command of {sorted(set(MODULES) - programs)} found in the docs"
    failures = [f"{i.where}: {problem}" for i in found for problem in problems_of(i)]
    assert failures == [], "\n".join(failures)


# The dry forms a guide shows (what a person runs first): each is run as written, in this process.
DRY_FLAGS = ("--help", "--plan")


def main_of(program: str):
    """The program's ``main(argv)``."""
    import importlib

    return importlib.import_module(program if "." in program else f"{program}.__main__").main


def test_every_dry_command_of_the_docs_runs_as_written(capsys):
    dry = [i for i in all_invocations() if set(DRY_FLAGS) & set(i.args) and i.program in MODULES]
    # The guides show these: the help of each command a guide starts with, and the plans of the paper's runs.
    assert {i.program for i in dry} >= {"trainer_module", "pipeline.kubeflow_v2_runner", "beam_preprocess"}, (
        dry
    )
    failures = []
    for invocation in dry:
        try:
            status = main_of(invocation.program)(list(invocation.args))
        except SystemExit as stop:  # argparse's --help
            status = stop.code
        captured = capsys.readouterr()
        if status not in (0, None) or not captured.out.strip() or "error:" in captured.err:
            failures.append(f"{invocation.where}: exit {status}: {captured.err.strip()[-300:]}")
    assert failures == [], "\n".join(failures)


def test_the_flag_check_refuses_a_flag_the_command_does_not_take():
    block = Block(
        README, "bash", 1, ("python -m beam_preprocess --output-dir out --num_hosts 4 \\", "  --shard-mb 8")
    )
    (invocation,) = invocations(block)
    assert problems_of(invocation) == ["--num_hosts: not an option of python -m beam_preprocess"]
    cases = {
        # Beam's options pass; a misspelt one does not.
        "python -m beam_preprocess --output-dir o --direct_num_workers 2 --direct_running_mode multi_threading": [],
        "python -m beam_preprocess --output-dir o --direct_num_worker 2 --direct-num-workers 2": [
            "--direct-num-workers: not an option of python -m beam_preprocess"
        ],
        "python -m trainer_module tune --preset demo --max-epochs 9 --model-dir x": [
            "--model-dir: not an option of python -m trainer_module"
        ],
        "python -m trainer_module --preset nope --plan": ["--preset nope: not one of its values"],
        "scripts/demo.sh --preset smoke --tune --tune-max-epochs 2 --pipeline-root=r": [],
        ".venv/bin/python -m pipeline.kubeflow_v2_runner --plan --accelerator tpu-v3-48": [
            "--accelerator tpu-v3-48: not one of its values"
        ],
        "nice python benchmarks/preprocess.py --repeats 5 --quick --nope": [
            "--nope: not an option of python benchmarks/preprocess.py"
        ],
    }
    for line, expected in cases.items():
        (invocation,) = invocations(Block(README, "bash", 1, (line,)))
        assert problems_of(invocation) == expected, line


def test_every_relative_link_and_anchor_resolves():
    failures = []
    for page in PAGES:
        seen = anchors(page)
        duplicated = sorted({a for a in seen if seen.count(a) > 1})
        if duplicated:  # GitHub and the site number repeated headings differently
            failures.append(f"{_name(page)}: headings with the same anchor: {duplicated}")
        for number, target in links(page):
            where = f"{_name(page)}:{number}: {target}"
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto:
            path_part, _, anchor = target.partition("#")
            path = (page.parent / path_part).resolve() if path_part else page
            if not path.exists():
                failures.append(f"{where}: no such file")
                continue
            if page == README and path_part and DOCS not in path.parents:
                failures.append(
                    f"{where}: the front page links into docs/ only (the site is built from there)"
                )
            if page != README and path != README and DOCS not in path.parents:
                failures.append(f"{where}: a guide links inside docs/ (or to ../README.md) only")
            if anchor and (path.suffix != ".md" or anchor not in anchors(path)):
                failures.append(f"{where}: no heading with this anchor")
    assert failures == [], "\n".join(failures)


def test_slugs_are_githubs():
    assert slug("Costs and `--plan`") == "costs-and---plan"
    assert slug("The paper's runs: multi-host TPU slices") == "the-papers-runs-multi-host-tpu-slices"
    assert slug("python -m beam_preprocess") == "python--m-beam_preprocess"


# The prefixes of the one-line messages the commands print (effnet_common.console, effnet_common.stopping,
# pipeline.outcome).
MESSAGE = re.compile(r"^(error|warning|stopped by the user|model NOT blessed): ")
# Parts of a message that stand for what varies: {placeholder} or … ("..." is the message's own text).
VARIABLE = re.compile(r"\{[^}]*\}|…")
# A fixed part is covered by literals of the code (or of the tests' expected messages) of at least this length,
# joined by at most a few characters of punctuation: a message is often composed of several literals.
LITERAL_MIN = 12
GLUE = set(" ,;:.()'\"/-=")


def troubleshooting_messages() -> list[tuple[int, str]]:
    found = []
    for block in code_blocks(TROUBLESHOOTING):
        found += [
            (block.first_line + i, line.strip())
            for i, line in enumerate(block.lines)
            if MESSAGE.match(line.strip())
        ]
    text = "\n".join(outside_code_blocks(TROUBLESHOOTING))
    for match in INLINE_CODE.finditer(text):
        span = " ".join(match[2].split())
        if MESSAGE.match(span):
            found.append((text.count("\n", 0, match.start()) + 1, span))
    return found


@functools.cache
def python_strings() -> str:
    """Every string literal of the project's Python files, the tests' included (their expected messages), one
    per line; adjacent literals joined as Python joins them, an f-string's fields as NUL."""
    strings = []
    for directory, subdirectories, files in os.walk(REPO):
        subdirectories[:] = [
            d
            for d in subdirectories
            if not d.startswith(".") and d not in ("build", "site", "outputs", "dist")
        ]
        for name in files:
            if not name.endswith(".py") or pathlib.Path(directory, name) == pathlib.Path(__file__):
                continue  # this file's own examples are no messages
            tree = ast.parse(pathlib.Path(directory, name).read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    strings.append(node.value)
                elif isinstance(node, ast.JoinedStr):
                    strings.append(
                        "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
                    )
    return "\n".join(" ".join(s.split("\n")) for s in strings)


def uncovered(piece: str, strings: str) -> str | None:
    """The first part of ``piece`` no literal of ``strings`` covers, or None: ``piece`` is read from the left, each
    time the longest stretch found in one literal (at least ``LITERAL_MIN`` characters, unless the piece is found
    whole), with up to 3 characters of punctuation between two stretches."""
    start, glue = 0, 0
    while start < len(piece):
        low, high = 0, len(piece) - start  # the longest prefix of piece[start:] found (found prefixes nest)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if piece[start : start + middle] in strings else (low, middle - 1)
        if low >= LITERAL_MIN or low == len(piece):  # a short piece: found whole
            start, glue = start + low, 0
        elif piece[start] in GLUE and glue < 3:
            start, glue = start + 1, glue + 1
        else:
            return piece[start : start + 40]
    return None


def test_every_message_the_troubleshooting_guide_lists_is_one_the_code_prints():
    messages = troubleshooting_messages()
    assert len(messages) >= 30, "docs/troubleshooting.md lists too few messages for the check to mean much"
    strings, failures = python_strings(), []
    for number, message in messages:
        fixed = [piece.strip(" :;,.()'\"/") for piece in VARIABLE.split(MESSAGE.sub("", message))]
        fixed = [piece for piece in fixed if len(piece) >= 6]
        if not fixed:
            continue  # a mention of the kind of line (`error: …`), not a message
        if max(map(len, fixed)) < 15:
            failures.append(
                f"docs/troubleshooting.md:{number}: too little of it is fixed to check: {message}"
            )
        missing = [part for piece in fixed if (part := uncovered(piece, strings))]
        if missing:
            failures.append(f"docs/troubleshooting.md:{number}: no literal of the code holds {missing[0]!r}")
    assert failures == [], "\n".join(failures)


def test_the_message_check_refuses_a_message_the_code_does_not_print():
    strings = python_strings()
    assert uncovered("--train-archive", strings) is None
    assert uncovered("inputs could not be used (more than --max-failures=", strings) is None
    assert (
        uncovered("the template was compiled for region us-central1, where its training job", strings) is None
    )
    assert (
        uncovered("inputs could not be read (more than --max-failures=", strings)
        == "read (more than --max-failures="
    )
    assert uncovered(": no such archive", strings) == "no such archive"


def test_the_site_builds_with_broken_links_as_errors(tmp_path):
    """mkdocs.yml is strict: a broken link or anchor, a page missing from the nav, fails the build."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=suite_env.child({"NO_MKDOCS_2_WARNING": "1"}),  # Material's notice about its successor
    )
    assert result.returncode == 0, result.stderr[-5000:]
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    # The home page is the README, its links into docs/ made the site's.
    assert "scripts/demo.sh" in home and 'href="sharding/' in home
