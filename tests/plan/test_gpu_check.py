"""benchmarks/gpu_check.sh --dry-run: every GPU command's flags exist and the
CUDA test selection collects tests (runs on CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~30 s: imports every benchmark once to read its flags
def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--out",
         str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("calibrate", "plan", "gsr", "offload"):
        assert f"  {name}: ok" in proc.stdout
    assert "CUDA tests selected" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["dry_run"] is True
    steps = {s["step"]: s for s in doc["steps"]}
    assert {"tests", "calibrate", "plan", "gsr", "offload", "dpr"} <= set(steps)
    assert "--device cuda" in steps["plan"]["command"]
    assert sum(s.get("timeout_s", 0) for s in doc["steps"]) < 8 * 60


def test_gpu_check_rejects_unknown_options():
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"),
                           "--fast"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "unknown option --fast" in proc.stderr
