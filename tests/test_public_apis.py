"""Package code reaches its libraries through their public APIs: no module imports Beam's internals.

Beam's internal packages (``apache_beam.internal``: its apitools credentials and HTTP client; the portability
runner's ``apache_beam.runners.portability``: the FnApiRunner, the job service; the Dataflow runner's
``apache_beam.runners.dataflow.internal``: its apitools Dataflow client) change without notice between Beam
releases. Every module of the installed packages is read (its syntax tree, so an import inside a function
counts as one at the top) and each import of them is named with its module and line.
"""

import ast
import os

import pytest

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("beam_preprocess", "components", "effnet_common", "pipeline", "trainer_module")
INTERNAL = (
    "apache_beam.internal",
    "apache_beam.runners.portability",
    "apache_beam.runners.dataflow.internal",
)


def imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``tree``; ``from a import b`` counts as ``a.b``, so that
    ``from apache_beam import internal`` is seen as the package it imports."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def internal_imports(source: str) -> list[tuple[int, str]]:
    """The imports of ``source`` that reach one of ``INTERNAL``."""
    return [
        (line, name)
        for line, name in imported_names(ast.parse(source))
        if any(name == prefix or name.startswith(prefix + ".") for prefix in INTERNAL)
    ]


def package_modules() -> list[str]:
    paths = []
    for package in PACKAGES:
        for root, _, files in os.walk(os.path.join(REPO_DIR, package)):
            paths += [os.path.join(root, name) for name in files if name.endswith(".py")]
    return sorted(paths)


def test_no_package_module_imports_beams_internals():
    modules = package_modules()
    assert len(modules) > 50  # every package was found
    offending = []
    for path in modules:
        with open(path, encoding="utf-8") as f:
            found = internal_imports(f.read())
        offending += [f"{os.path.relpath(path, REPO_DIR)}:{line} imports {name}" for line, name in found]
    assert not offending, "Beam internals imported by package code:\n" + "\n".join(offending)


@pytest.mark.parametrize(
    "source, found",
    [
        ("import apache_beam.internal.gcp.auth", [(1, "apache_beam.internal.gcp.auth")]),
        ("def f():\n    from apache_beam.runners.portability.fn_api_runner import fn_runner",
         [(2, "apache_beam.runners.portability.fn_api_runner.fn_runner")]),
        ("from apache_beam.runners.dataflow import internal", [(1, "apache_beam.runners.dataflow.internal")]),
        ("from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner", []),
        ("from apache_beam.options.pipeline_options import PipelineOptions\nimport apache_beam.internally", []),
    ],
)  # fmt: skip
def test_the_scan_sees_every_form_of_import(source, found):
    assert internal_imports(source) == found
