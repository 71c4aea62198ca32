"""Where the benchmark scripts put their results.

Every script writes its JSON into ``results/`` and its markdown section into
``benchmarks/README.md`` (between ``<!-- BEGIN name -->`` and
``<!-- END name -->``), atomically, so an interrupted run never leaves a
half-written table and re-running one benchmark never touches the others'
sections. ``--quick`` runs go to ``results/quick/`` and never overwrite the
full results or the README.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from leangnn.utils import atomic_write_text

__all__ = ["ROOT", "README", "results_path", "write_json", "write_section"]

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "benchmarks" / "README.md"


def results_path(name: str, quick: bool = False) -> Path:
    """``results/<name>`` for full runs, ``results/quick/<name>`` for quick ones."""
    return ROOT / "results" / ("quick" if quick else "") / name


def write_json(path: str | Path, obj) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")
    return path


def write_section(name: str, markdown: str, path: str | Path = README) -> Path:
    """Replace the ``name`` section of ``path`` (appended when missing).

    A ``path`` other than a README with markers (e.g. ``results/quick/x.md``)
    is written whole.
    """
    path = Path(path)
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}\n"
    text = path.read_text() if path.is_file() else ""
    if path.name != "README.md":
        text = ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "") + block
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return path
