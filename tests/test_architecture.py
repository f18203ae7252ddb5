"""docs/architecture.md, the map of the code, names every top-level package and folder of the project."""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAP = os.path.join(REPO, "docs", "architecture.md")
# The folders that hold no Python package but are part of the map all the same.
FOLDERS = ("tests", "benchmarks", "scripts", "docs")


def _top_level_packages() -> list[str]:
    return sorted(
        name
        for name in os.listdir(REPO)
        if not name.startswith(".") and os.path.isfile(os.path.join(REPO, name, "__init__.py"))
    )


def _named_in_the_map() -> set[str]:
    with open(MAP) as f:
        return set(re.findall(r"`([a-z_]+)/`", f.read()))


def test_the_architecture_map_names_every_top_level_package_and_folder():
    packages = _top_level_packages()
    assert "trainer_module" in packages and "effnet_common" in packages  # the listing sees the packages
    missing = [name for name in (*packages, *FOLDERS) if name not in _named_in_the_map()]
    assert missing == [], f"docs/architecture.md does not name {missing}: add each to its package table"


def test_the_readme_links_the_map():
    with open(os.path.join(REPO, "README.md")) as f:
        head = f.read(2000)
    assert "docs/architecture.md" in head
