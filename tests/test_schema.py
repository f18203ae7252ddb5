"""The shard contract's ImageNet facts: shipped with the package, the same lists tensorflow-datasets ships,
read without it, and not a run-time dependency."""

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from effnet_common import schema

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tfds_file(name):
    spec = importlib.util.find_spec("tensorflow_datasets")
    if spec is None:
        pytest.skip("tensorflow-datasets is not installed (the dev extra installs it)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "imagenet2012", name)
    with open(path, encoding="utf-8") as f:
        return tuple(line.strip() for line in f if line.strip())


def test_the_shipped_lists_are_tensorflow_datasets_own():
    assert schema.synsets() == _tfds_file("labels.txt")
    assert schema.validation_synsets() == _tfds_file("validation_labels.txt")


def test_the_lists_hold_imagenets_facts():
    synsets = schema.synsets()
    assert len(synsets) == schema.NUM_CLASSES == len(set(synsets)) and list(synsets) == sorted(synsets)
    assert (synsets[0], synsets[-1]) == ("n01440764", "n15075141")
    assert len(schema.validation_synsets()) == schema.NUM_VALIDATION_IMAGES
    assert set(schema.validation_synsets()) == set(synsets)
    assert schema.validation_synset_for("ILSVRC2012_val_00000001.JPEG") == "n01751748"


def test_reading_them_imports_no_tensorflow_datasets():
    probe = (
        "import sys; from effnet_common import schema; schema.synsets(); schema.validation_synsets(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow_datasets', 'tensorflow')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def _setup_call():
    with open(os.path.join(REPO, "setup.py")) as f:
        tree = ast.parse(f.read())
    names = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
    }
    return names


def test_tensorflow_datasets_is_no_run_time_requirement():
    requirements = _setup_call()["INSTALL_REQUIRES"]
    assert not [
        r for r in requirements if r.lower().startswith(("tensorflow-datasets", "importlib_resources"))
    ]


@pytest.mark.slow
def test_the_wheel_carries_the_lists(tmp_path):
    # Built from a copy: a build in the checkout would leave build/ there.
    source = tmp_path / "source"
    ignored = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "outputs")
    shutil.copytree(REPO, source, ignore=ignored)
    wheel_command = [
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(tmp_path),
        str(source),
    ]
    subprocess.run([sys.executable, "-m", *wheel_command], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("effnet_pipeline-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert f"effnet_common/data/{schema.SYNSETS_FILE}" in names
    assert f"effnet_common/data/{schema.VALIDATION_SYNSETS_FILE}" in names
