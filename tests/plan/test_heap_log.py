"""benchmarks/heap_log.py: the resident-page model of a malloc log and the
epochs it finds (a synthetic log), and the logger end to end (slow)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
BASE = 1 << 32  # where the synthetic heap starts


def _tool():
    spec = importlib.util.spec_from_file_location(
        "heap_log", ROOT / "benchmarks" / "heap_log.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _log(path: Path, events: list[tuple[int, int, int, int]]) -> Path:
    """events: (op, size, pointer, break), as mlog.c writes them."""
    rec = np.array([((op << 56) | size, ptr, brk) for op, size, ptr, brk in events],
                   dtype=np.uint64)
    rec.tofile(path)
    return path


def test_resident_pages_follow_blocks_and_trims(tmp_path):
    tool = _tool()
    top = BASE + 16 * MiB
    log = _log(tmp_path / "a.log", [
        (1, 4 * MiB, BASE, top),            # resident: 4 MiB
        (9, 8, 0, top),                     # a trim's end: all covered, stays
        (9, 1, 0, top),                     # backward
        (1, 8 * MiB, BASE + 4 * MiB, top),  # 12 MiB
        (2, 0, BASE + 4 * MiB, top),        # freed: still resident
        (1, 64, BASE + 5 * MiB, top),       # a small one in its hole
        (1, 100, BASE + 12 * MiB, top),     # one page more, not in a hole
        (9, 2, 0, top),
        (9, 8, 0, top),                     # trim: the freed 8 MiB goes
        (9, 1, 0, top),
        (1, 2 * MiB, BASE + 4 * MiB, top),  # back in part of the hole
        (9, 2, 0, top),
        (9, 8, 0, top),
    ])
    marks, events = tool.resident(log)
    assert events == 13
    real = [m for m in marks if m[1]]
    assert [m[1] for m in real] == [8, 1, 2, 8, 1, 2, 8]
    # between the first backward and its end: 4 + 8 MiB and one page
    hw = [m for m in marks if m[1] == 0][2]
    assert hw[2] == pytest.approx(12 + 4096 / MiB)
    # after the second trim: the 4 MiB block and the small ones' two pages
    assert real[3][2] == pytest.approx(4 + 8192 / MiB)
    assert real[5][2] == pytest.approx(6 + 4096 / MiB)  # (one page was in)
    # small requests so far, of them in a freed large block, of those alive
    assert real[2][4:] == (2, 1, [5]) and real[5][4:] == (2, 1, [5])
    assert real[0][4:] == (0, 0, [])
    assert real[0][3] == pytest.approx(16.0)  # break above the heap's start
    assert tool.epochs(marks) == [(1, 7), (7, 13)]


def test_the_epochs_need_a_backward_between_trims(tmp_path):
    tool = _tool()
    top = BASE + MiB
    log = _log(tmp_path / "b.log", [(1, 64, BASE, top), (9, 8, 0, top),
                                    (9, 8, 0, top), (9, 3, 0, top), (9, 8, 0, top)])
    marks, _ = tool.resident(log)
    assert tool.epochs(marks) == []  # validation and a step alone: no epoch


def test_a_log_cut_short_or_empty(tmp_path):
    tool = _tool()
    top = BASE + MiB
    log = _log(tmp_path / "c.log", [(1, 64, BASE, top), (9, 8, 0, top),
                                    (1, 2 * MiB, BASE + 4096, top)])
    data = log.read_bytes()
    log.write_bytes(data[:-8])  # the last record cut in its middle
    marks, events = tool.resident(log)
    assert events == 2 and [m[1] for m in marks] == [0, 8]
    for bad in (b"", data[:16]):  # nothing, or no whole record
        log.write_bytes(bad)
        with pytest.raises(ValueError, match="no heap allocation in the log"):
            tool.resident(log)
    with pytest.raises(ValueError, match="no heap allocation"):
        tool.resident(tmp_path / "missing.log")


@pytest.mark.slow  # ~30 s: compiles the logger and runs a short training
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_heap_log_end_to_end(tmp_path, monkeypatch):
    out = tmp_path / "heap_log.json"
    code = (f"import sys; sys.argv = ['heap_log', '--name', 'tiny', '--', "
            f"'--dataset', 'csbm:500', '--model', 'sage', '--layers', '2', "
            f"'--hidden', '16', '--epochs', '2']; "
            f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import heap_log; "
            f"heap_log.OUT = __import__('pathlib').Path({str(out)!r}); "
            f"sys.exit(heap_log.main())")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    row = json.loads(out.read_text())["rows"][0]
    assert row["name"] == "tiny" and len(row["epochs"]) == 2
    for e in row["epochs"]:
        # what the log says is resident is part of what the meter measured
        assert 0 < e["resident_mib"] <= e["measured_peak_mib"] + 1
        assert e["replay_extent_mib_min0"] >= e["replay_extent_mib_min65536"]
