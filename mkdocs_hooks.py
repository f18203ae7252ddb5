"""MkDocs hooks (mkdocs.yml): the site's home page is README.md, from its one source.

MkDocs builds the files under ``docs_dir`` only, and README.md stays at the repository's root, where GitHub shows
it. The home page is made from it at build time: its links into ``docs/`` lose that prefix (the guides are the
site's root), and the guides' links back to ``../README.md`` point at the home page.
"""

from __future__ import annotations

import pathlib
import re

from mkdocs.structure.files import File

README = pathlib.Path(__file__).resolve().parent / "README.md"
HOME = "index.md"


def on_files(files, config):
    files.append(File.generated(config, HOME, content=README.read_text(encoding="utf-8")))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == HOME:
        return re.sub(r"\]\(docs/", "](", markdown)
    return re.sub(r"\]\(\.\./README\.md", f"]({HOME}", markdown)
