"""The Dockerfile's images, checked without a container runtime, in the everyday tier.

The Dockerfile is parsed into its stages (``FROM ... AS name``), each build target is followed through the
stages it builds on, and what it installs, copies and runs is checked against constraints.txt,
constraints-accelerators.txt, the repository's files and the packages installed here. No network: every
fact comes from files in the repository or from this virtualenv. The images built by a real Docker daemon and
run are tests/test_images_built.py's; docs/images.md says how to build and push.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import importlib.util
import json
import re
import shlex
from pathlib import Path, PurePosixPath

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from setuptools import find_packages

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
CONSTRAINTS = REPO / "constraints.txt"
ACCELERATOR_PINS = REPO / "constraints-accelerators.txt"

TRAINER_TARGETS = ("trainer-tpu", "trainer-gpu")
TARGETS = ("pipeline", *TRAINER_TARGETS)
TPU_PACKAGES = {"tensorflow-tpu", "libtpu"}
BEAM_SDK_IMAGE = re.compile(r"apache/beam_python(?P<python>\d+\.\d+)_sdk:(?P<version>[\w.]+)")


# ---------------------------------------------------------------------------------------------------------
# The Dockerfile as data


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    image: str  # what FROM names: an image, or an earlier stage
    instructions: tuple[tuple[str, str], ...]  # (KEYWORD, arguments)


@dataclasses.dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]
    destination: PurePosixPath  # absolute, WORKDIR applied
    into_directory: bool  # sources land under destination by their own name
    from_image: str | None  # COPY --from=...

    def places(self, path: PurePosixPath) -> bool:
        """Whether this COPY puts ``path`` (a file or directory of the image) into the image."""
        for source in self.sources:
            target = (
                self.destination / PurePosixPath(source).name if self.into_directory else self.destination
            )
            if path == target or target in path.parents:
                return True
        return False


@dataclasses.dataclass(frozen=True)
class Run:
    workdir: PurePosixPath
    copies_before: tuple[Copy, ...]
    commands: tuple[tuple[str, ...], ...]  # the shell commands joined by &&


@dataclasses.dataclass(frozen=True)
class PipCommand:
    action: str  # install, uninstall, ...
    options: dict[str, list[str]]  # "-c" / "--constraint" -> "constraint", "-f" -> "find_links", ...
    flags: frozenset[str]
    arguments: tuple[str, ...]  # requirements, "." for the project

    def requirements(self) -> list[Requirement]:
        return [Requirement(argument) for argument in self.arguments if argument != "."]

    def names(self) -> set[str]:
        return {canonicalize_name(requirement.name) for requirement in self.requirements()}


def read_instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction: continuation lines joined, comment lines dropped."""
    instructions, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1]
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return instructions


def parse_stages(text: str) -> dict[str, Stage]:
    """The stages in file order, by name (an unnamed stage by its index); a FROM's ``${ARG}`` is the default
    of the ARG declared before the first FROM (what a build without --build-arg uses)."""
    stages: list[tuple[str, str, list]] = []
    defaults: dict[str, str] = {}
    for keyword, arguments in read_instructions(text):
        if keyword == "ARG" and not stages:
            name, _, default = arguments.partition("=")
            defaults[name] = default
        elif keyword == "FROM":
            words = [word for word in arguments.split() if not word.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].lower() == "as" else str(len(stages))
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: defaults[m.group(1)], words[0])
            stages.append((name, image, []))
        elif stages:
            stages[-1][2].append((keyword, arguments))
    return {name: Stage(name, image, tuple(instructions)) for name, image, instructions in stages}


def lineage(stages: dict[str, Stage], target: str) -> list[Stage]:
    """The stages a target is built from, its root image's stage first."""
    chain = [stages[target]]
    while chain[0].image in stages:
        chain.insert(0, stages[chain[0].image])
    return chain


def instructions_of(stages: dict[str, Stage], target: str) -> list[tuple[str, str]]:
    return [instruction for stage in lineage(stages, target) for instruction in stage.instructions]


def exec_form(arguments: str) -> list[str]:
    return json.loads(arguments) if arguments.startswith("[") else shlex.split(arguments)


def parse_copy(arguments: str, workdir: PurePosixPath) -> Copy:
    words = exec_form(arguments)
    flags = dict(word[2:].partition("=")[::2] for word in words if word.startswith("--"))
    *sources, destination = [word for word in words if not word.startswith("--")]
    return Copy(
        sources=tuple(sources),
        destination=workdir / destination,
        into_directory=destination.endswith("/") or len(sources) > 1,
        from_image=flags.get("from"),
    )


def shell_commands(arguments: str) -> list[tuple[str, ...]]:
    commands: list[list[str]] = [[]]
    for word in shlex.split(arguments):
        if word in ("&&", "||", ";"):
            commands.append([])
        else:
            commands[-1].append(word)
    return [tuple(command) for command in commands if command]


def from_stage(stages: dict[str, Stage], copy: Copy) -> list[Copy]:
    """A ``COPY --from=STAGE`` as what it brings in: the build context's files that STAGE copied under the
    source path (re-rooted at the destination), or, from a stage that copies nothing (an image's), that image."""
    stage = stages.get(copy.from_image or "")
    if stage is None:
        return [copy]
    brought = []
    for inner in walk(stages, stage.name)[0]:
        for source in copy.sources:
            root = PurePosixPath(source)
            if inner.from_image is None and (inner.destination == root or root in inner.destination.parents):
                destination = copy.destination / inner.destination.relative_to(root)
                brought.append(dataclasses.replace(inner, destination=destination))
    if brought:
        return brought
    return [dataclasses.replace(copy, from_image=stage.image if not stage.instructions else stage.name)]


def walk(stages: dict[str, Stage], target: str) -> tuple[list[Copy], list[Run]]:
    """Every COPY and RUN of a target, in build order, with the WORKDIR each one saw."""
    workdir, copies, runs = PurePosixPath("/"), [], []
    for keyword, arguments in instructions_of(stages, target):
        if keyword == "WORKDIR":
            workdir = workdir / arguments
        elif keyword == "COPY":
            copies.extend(from_stage(stages, parse_copy(arguments, workdir)))
        elif keyword == "RUN":
            runs.append(Run(workdir, tuple(copies), tuple(shell_commands(arguments))))
    return copies, runs


_PIP_VALUE_OPTIONS = {
    "-c": "constraint",
    "--constraint": "constraint",
    "-f": "find_links",
    "--find-links": "find_links",
    "-r": "requirement",
    "--requirement": "requirement",
    "-i": "index_url",
    "--index-url": "index_url",
    "--extra-index-url": "extra_index_url",
}


def pip_command(command: tuple[str, ...]) -> PipCommand | None:
    if command[:1] in (("pip",), ("pip3",)):
        words = list(command[1:])
    elif command[:3] in (("python", "-m", "pip"), ("python3", "-m", "pip")):
        words = list(command[3:])
    else:
        return None
    action, options, flags, arguments = words.pop(0), {}, set(), []
    while words:
        word = words.pop(0)
        option, has_value, value = word.partition("=")
        if option in _PIP_VALUE_OPTIONS:
            options.setdefault(_PIP_VALUE_OPTIONS[option], []).append(value if has_value else words.pop(0))
        elif word.startswith("-"):
            flags.add(word)
        else:
            arguments.append(word)
    return PipCommand(action, options, frozenset(flags), tuple(arguments))


def pip_commands(runs: list[Run]) -> list[tuple[Run, PipCommand]]:
    return [(run, pip) for run in runs for command in run.commands if (pip := pip_command(command))]


def python_code(command: tuple[str, ...]) -> str | None:
    """The program of ``python -c PROGRAM``."""
    if command[:1] in (("python",), ("python3",)) and "-c" in command:
        return command[command.index("-c") + 1]
    return None


def imported_modules(code: str) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


# ---------------------------------------------------------------------------------------------------------
# The other files the images depend on


def read_pins(path: Path) -> dict[str, Requirement]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            pins[canonicalize_name(requirement.name)] = requirement
    return pins


def exact_version(requirement: Requirement) -> str:
    specifiers = list(requirement.specifier)
    assert len(specifiers) == 1 and specifiers[0].operator == "==", f"{requirement} is not one exact pin"
    return specifiers[0].version


def project_packages() -> set[str]:
    """The top-level packages setup.py installs: its find_packages(include=...) run on the repository."""
    tree = ast.parse((REPO / "setup.py").read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "find_packages"
    ]
    assert len(calls) == 1, "setup.py should list its packages with one find_packages(include=[...]) call"
    include = ast.literal_eval({keyword.arg: keyword.value for keyword in calls[0].keywords}["include"])
    packages = {package.split(".")[0] for package in find_packages(where=str(REPO), include=include)}
    assert packages, f"find_packages(include={include}) finds nothing in {REPO}"
    return packages


def tfx_vertex_trainer_command() -> list[str]:
    """The command TFX's Vertex Trainer gives every worker pool, read from the installed TFX's source."""
    tfx_dir = Path(importlib.util.find_spec("tfx").submodule_search_locations[0])
    source = tfx_dir / "extensions" / "google_cloud_ai_platform" / "training_clients.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "_CONTAINER_COMMAND" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"_CONTAINER_COMMAND not found in {source}: TFX changed how it starts the trainer")


def trainer_run_fn() -> str:
    """The run_fn the pipeline hands the Trainer (``RUN_FN`` in pipeline/pipeline_def.py)."""
    for node in ast.parse((REPO / "pipeline" / "pipeline_def.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "RUN_FN" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("pipeline/pipeline_def.py no longer defines RUN_FN, the Trainer's run_fn")


def dockerignore_patterns() -> list[str]:
    path = REPO / ".dockerignore"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _pattern_regex(pattern: str) -> re.Pattern:
    parts, index = [], 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            parts.append("(?:.*/)?")
            index += 3
        elif pattern.startswith("**", index):
            parts.append(".*")
            index += 2
        else:
            parts.append({"*": "[^/]*", "?": "[^/]"}.get(pattern[index], re.escape(pattern[index])))
            index += 1
    return re.compile("".join(parts))


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: a pattern excludes a path it matches or one of its parent directories;
    the last matching pattern wins, and a leading ! re-includes."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: length + 1]) for length in range(len(parts))]
    ignored = False
    for pattern in patterns:
        include = pattern.startswith("!")
        regex = _pattern_regex(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not include
    return ignored


# ---------------------------------------------------------------------------------------------------------
# Tests


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return parse_stages(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def tensorflow_version() -> str:
    return exact_version(read_pins(CONSTRAINTS)["tensorflow"])


def test_the_three_targets_exist_and_a_plain_build_gives_the_pipeline_image(stages):
    assert set(TARGETS) <= set(stages), f"targets missing: {set(TARGETS) - set(stages)}"
    # `docker build .` without --target builds the last stage: the pipeline image, as before the targets.
    assert list(stages)[-1] == "pipeline"


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_installs_the_project_with_constraints(stages, target):
    _, runs = walk(stages, target)
    installs = [pip for _, pip in pip_commands(runs) if pip.action == "install" and "." in pip.arguments]
    resolving = [pip for pip in installs if "--no-deps" not in pip.flags]
    assert resolving, f"{target} never installs the project's dependencies (pip install . without --no-deps)"
    for pip in resolving:
        constraints = pip.options.get("constraint", [])
        assert "constraints.txt" in constraints, f"{target}: project installed without -c constraints.txt"
    # The code's own layer installs the project alone, over what the dependencies' layer installed.
    assert "--no-deps" in installs[-1].flags and "--force-reinstall" in installs[-1].flags
    for pip in installs:
        # tfx 1.16 declares Requires-Python <3.11 (STACK.md): without the flag pip refuses it.
        assert "--ignore-requires-python" in pip.flags


@pytest.mark.parametrize("target", TARGETS)
def test_every_file_pip_reads_is_copied_into_the_image_before(stages, target):
    _, runs = walk(stages, target)
    for run, pip in pip_commands(runs):
        needed = [*pip.options.get("constraint", []), *pip.options.get("requirement", [])]
        needed += ["setup.py"] if "." in pip.arguments else []
        for name in needed:
            assert any(
                copy.places(run.workdir / name) for copy in run.copies_before if not copy.from_image
            ), f"{target}: pip {pip.action} reads {run.workdir / name}, which no COPY before it puts there"


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_ends_its_build_with_the_project_import_check(stages, target):
    runs = [arguments for keyword, arguments in stages[target].instructions if keyword == "RUN"]
    assert runs, f"{target} runs nothing of its own"
    code = python_code(shell_commands(runs[-1])[-1])
    assert code is not None, f"{target}'s last RUN does not end with python -c 'import ...'"
    assert imported_modules(code) >= project_packages()


@pytest.mark.parametrize("target", TARGETS)
def test_base_image_runs_the_python_the_constraints_were_resolved_for(stages, target):
    root = lineage(stages, target)[0].image
    image = re.fullmatch(r"python:(\d+\.\d+)[-.\w]*", root)
    assert image, f"{target} starts from {root}, not an official python:X.Y image whose tag names its Python"
    resolved_for = re.search(r"CPython (\d+\.\d+)", CONSTRAINTS.read_text())
    assert resolved_for, "constraints.txt's header no longer says which CPython it was resolved for"
    assert image.group(1) == resolved_for.group(1)


def test_pipeline_runs_the_boot_program_of_the_beam_sdk_image_pinned_in_constraints(stages):
    copies, _ = walk(stages, "pipeline")
    entrypoints = [
        exec_form(args) for keyword, args in instructions_of(stages, "pipeline") if keyword == "ENTRYPOINT"
    ]
    assert entrypoints, "Dataflow starts the pipeline image's workers through its ENTRYPOINT"
    program = PurePosixPath(entrypoints[-1][0])
    providers = [copy for copy in copies if copy.places(program)]  # from the beam-sdk stage's image
    assert providers and providers[-1].from_image, f"{program} is not copied from an image"
    sdk = BEAM_SDK_IMAGE.fullmatch(providers[-1].from_image)
    assert sdk, f"{program} comes from {providers[-1].from_image}, not an apache/beam_pythonX.Y_sdk image"
    assert sdk["version"] == exact_version(read_pins(CONSTRAINTS)["apache-beam"])
    python = re.match(r"python:(\d+\.\d+)", lineage(stages, "pipeline")[0].image)
    assert python and sdk["python"] == python.group(1)


def test_accelerator_pins_belong_to_the_tensorflow_of_constraints(tensorflow_version):
    constraints, pins = read_pins(CONSTRAINTS), read_pins(ACCELERATOR_PINS)
    for requirement in pins.values():
        assert not (requirement.extras or requirement.marker), f"{requirement}: a constraint takes neither"
        exact_version(requirement)
    assert not set(pins) & set(constraints), "a package pinned in both constraint files"
    assert TPU_PACKAGES <= set(pins)
    assert exact_version(pins["tensorflow-tpu"]) == tensorflow_version
    # The GPU pins are what tensorflow[and-cuda] requires at that version: read from the tensorflow installed
    # here, which is constraints.txt's.
    installed = importlib.metadata.version("tensorflow")
    assert installed == tensorflow_version, f"tensorflow {installed} here, {tensorflow_version} pinned"
    and_cuda = {}
    for line in importlib.metadata.requires("tensorflow"):
        requirement = Requirement(line)
        marker = requirement.marker
        if marker and marker.evaluate({"extra": "and-cuda"}) and not marker.evaluate({"extra": ""}):
            and_cuda[canonicalize_name(requirement.name)] = str(requirement.specifier)
    gpu_pins = {
        name: str(requirement.specifier) for name, requirement in pins.items() if name not in TPU_PACKAGES
    }
    assert and_cuda and gpu_pins == and_cuda


def test_trainer_tpu_replaces_the_cpu_tensorflow_by_the_tpu_build(stages):
    _, runs = walk(stages, "trainer-tpu")
    pips = [pip for _, pip in pip_commands(runs)]
    project = next(i for i, pip in enumerate(pips) if pip.action == "install" and "." in pip.arguments)
    tpu = next(i for i, pip in enumerate(pips) if pip.action == "install" and "tensorflow-tpu" in pip.names())
    removals = [
        i for i, pip in enumerate(pips) if pip.action == "uninstall" and "tensorflow" in pip.arguments
    ]
    # Both wheels hold the tensorflow/ package: the CPU one the project brings in goes before the TPU one.
    assert any(project < i < tpu for i in removals), "the CPU tensorflow wheel stays beside tensorflow-tpu"
    assert "--yes" in pips[removals[0]].flags or "-y" in pips[removals[0]].flags, "pip uninstall would prompt"
    later = [pip for pip in pips[tpu + 1 :] if pip.action == "install" and "--no-deps" not in pip.flags]
    assert not later, "a pip install after tensorflow-tpu's may bring the CPU tensorflow back"
    install = pips[tpu]
    assert install.names() == TPU_PACKAGES
    versioned = [str(requirement) for requirement in install.requirements() if requirement.specifier]
    assert not versioned, f"{versioned}: the versions belong in {ACCELERATOR_PINS.name}"
    assert {"constraints.txt", ACCELERATOR_PINS.name} <= set(install.options.get("constraint", []))
    # libtpu is only on Google's find-links index (a build argument, whose default is that index); the pins file
    # documents which one.
    arguments = dict(a.partition("=")[::2] for k, a in stages["trainer-tpu"].instructions if k == "ARG")
    links = [
        re.sub(r"\$\{?(\w+)\}?", lambda m: arguments[m.group(1)], url)
        for url in install.options["find_links"]
    ]
    assert links and all(url.startswith("https://") and url in ACCELERATOR_PINS.read_text() for url in links)


def test_trainer_gpu_installs_tensorflow_with_cuda_at_the_constraints_version(stages, tensorflow_version):
    _, runs = walk(stages, "trainer-gpu")
    pips = [pip for _, pip in pip_commands(runs) if pip.action == "install"]
    cuda = [
        (pip, requirement)
        for pip in pips
        for requirement in pip.requirements()
        if canonicalize_name(requirement.name) == "tensorflow" and "and-cuda" in requirement.extras
    ]
    assert cuda, "trainer-gpu never installs tensorflow[and-cuda]"
    for pip, requirement in cuda:
        assert {"constraints.txt", ACCELERATOR_PINS.name} <= set(pip.options.get("constraint", []))
        assert not requirement.specifier or requirement.specifier == f"=={tensorflow_version}"
    assert not any(TPU_PACKAGES & pip.names() for pip in pips)


def test_pipeline_image_installs_no_accelerator_build(stages):
    _, runs = walk(stages, "pipeline")
    for _, pip in pip_commands(runs):
        assert not TPU_PACKAGES & pip.names()
        assert not any(requirement.extras for requirement in pip.requirements())


@pytest.mark.parametrize("target", TRAINER_TARGETS)
def test_trainer_images_run_what_the_vertex_trainer_runs(stages, target):
    instructions = instructions_of(stages, target)
    # Vertex replaces the command (ENTRYPOINT) with TFX's; an ENTRYPOINT such as Beam's boot program would
    # only make a local `docker run` differ from the job.
    assert not [args for keyword, args in instructions if keyword == "ENTRYPOINT"]
    commands = [exec_form(args) for keyword, args in instructions if keyword == "CMD"]
    assert commands and commands[-1] == tfx_vertex_trainer_command()


@pytest.mark.parametrize("target", TRAINER_TARGETS)
def test_the_run_fn_the_trainer_calls_is_copied_before_the_project_install(stages, target):
    module, _, function = trainer_run_fn().rpartition(".")
    source = Path(importlib.util.find_spec(module).origin).resolve()
    assert REPO in source.parents, f"{module} is not this repository's"
    functions = {
        node.name for node in ast.parse(source.read_text()).body if isinstance(node, ast.FunctionDef)
    }
    assert function in functions, f"{source} defines no {function}"
    _, runs = walk(stages, target)
    *_, run = [run for run, pip in pip_commands(runs) if pip.action == "install" and "." in pip.arguments]
    image_path = run.workdir / source.relative_to(REPO).as_posix()
    assert any(copy.places(image_path) for copy in run.copies_before if not copy.from_image), image_path


def test_every_module_the_images_run_or_import_is_importable_here(stages):
    modules = set()
    for name in stages:
        _, runs = walk(stages, name)
        for command in (command for run in runs for command in run.commands):
            if (code := python_code(command)) is not None:
                modules |= imported_modules(code)
        for keyword, args in stages[name].instructions:
            program = exec_form(args) if keyword in ("CMD", "ENTRYPOINT") else []
            if program[:2] in (["python", "-m"], ["python3", "-m"]):
                modules.add(program[2])
    assert project_packages() <= modules
    missing = sorted(module for module in modules if importlib.util.find_spec(module) is None)
    assert not missing, f"not importable here: {missing}"


def test_every_copied_path_exists_and_is_in_the_build_context(stages):
    patterns = dockerignore_patterns()
    sources = {
        source
        for name in stages
        for copy in walk(stages, name)[0]
        if not copy.from_image
        for source in copy.sources
    }
    assert sources
    for source in sorted(sources):
        path = REPO / source
        assert path.exists(), f"COPY {source}: no such file in the repository"
        files = [path] if path.is_file() else [f for f in path.rglob("*.py") if "__pycache__" not in f.parts]
        for file in files:
            relative = file.relative_to(REPO).as_posix()
            assert not dockerignored(relative, patterns), f"{relative} is copied but .dockerignore drops it"
