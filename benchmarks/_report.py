"""Where the benchmark scripts put their results.

Every script writes its JSON into ``results/`` and its markdown section into
``benchmarks/README.md`` (between ``<!-- BEGIN name -->`` and
``<!-- END name -->``), atomically, so an interrupted run never leaves a
half-written table and re-running one benchmark never touches the others'
sections. ``--quick`` runs go to ``results/quick/`` and never overwrite the
full results or the README. Plots are drawn in :func:`figure` (matplotlib's
Agg backend: no display needed) and written the same way.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from leangnn.utils import atomic_write_text, temp_path

__all__ = ["ROOT", "README", "results_path", "markdown_path", "write_json",
           "merge_rows", "write_section", "can_plot", "figure"]

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "benchmarks" / "README.md"


def results_path(name: str, quick: bool = False) -> Path:
    """``results/<name>`` for full runs, ``results/quick/<name>`` for quick ones."""
    return ROOT / "results" / ("quick" if quick else "") / name


def markdown_path(name: str, quick: bool = False) -> Path:
    """Where benchmark ``name`` writes its markdown: its section of
    ``benchmarks/README.md``, or ``results/quick/<name>.md`` for quick runs."""
    return results_path(f"{name}.md", True) if quick else README


def write_json(path: str | Path, obj) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")
    return path


def merge_rows(path: str | Path, rows: list[dict]) -> list[dict]:
    """Write ``rows`` into the JSON at ``path`` (``{"rows": [...]}``,
    atomically), replacing the stored rows of the same ``name``; returns the
    stored rows kept."""
    path = Path(path)
    old = json.loads(path.read_text()) if path.is_file() else {}
    done = {r["name"] for r in rows}
    keep = [x for x in old.get("rows", []) if x["name"] not in done]
    write_json(path, {"rows": keep + rows})
    return keep


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


def can_plot(path: str | Path) -> bool:
    """Whether matplotlib (the ``bench`` extra) is installed; if not, says on
    stderr that ``path`` is not drawn, so a run still writes its JSON and
    markdown."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"matplotlib is not installed (pip install 'leangnn[bench]'): "
              f"{path} not drawn", file=sys.stderr)
        return False
    return True


@contextmanager
def figure(path: str | Path, nrows: int = 1, ncols: int = 1, dpi: int = 120,
           **subplots) -> Iterator[tuple]:
    """``with figure(path, 1, 2, figsize=...) as (fig, axes):`` draw, and the
    figure is laid out and written to ``path`` (through a temporary file, so
    an interrupted run never leaves half an image) when the block ends
    without error; it is closed either way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, axes = plt.subplots(nrows, ncols, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(path)
        try:
            fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=dpi)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    finally:
        plt.close(fig)
