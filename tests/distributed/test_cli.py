"""``leangnn train --nproc P``: the CLI launches P ranks, rank 0 alone writes
the run, and graph-parallel training reproduces single-process training."""

from __future__ import annotations

import json

import pytest

from leangnn.cli import main

ARGS = ["--model", "res", "--dataset", "iscas85/c432,iscas85/c880",
        "--test-dataset", "iscas85/c499",
        "--layers", "2", "--hidden", "8", "--epochs", "2", "--quiet"]


@pytest.mark.slow  # two CLI runs, one of them P fresh interpreters (~40 s)
def test_nproc_graph_parallel_equals_one_process(tmp_path, capfd):
    assert main(["train", *ARGS, "--out", str(tmp_path / "full")]) == 0
    assert main(["train", *ARGS, "--nproc", "2", "--dist-mode", "graph",
                 "--out", str(tmp_path / "dist")]) == 0
    full = json.loads((tmp_path / "full" / "summary.json").read_text())
    dist = json.loads((tmp_path / "dist" / "summary.json").read_text())
    assert dist["strategy"] == "distributed"
    assert dist["distributed"]["world_size"] == 2
    for key, value in full["metrics"]["test"].items():
        assert dist["metrics"]["test"][key] == pytest.approx(value, rel=2e-3, abs=1e-4)
    # (float32 through Adam: gradients agree to ~1e-6, see test_graph_parallel;
    # two optimizer steps amplify that a little.) One run directory, written by
    # rank 0 only, and one summary line for the job.
    lines = [ln for ln in capfd.readouterr().out.splitlines()
             if ln.startswith("leangnn train:")]
    assert len(lines) == 2
    metrics = (tmp_path / "dist" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(m)["epoch"] for m in metrics] == [1, 2]


def test_nproc_must_be_positive(capsys):
    assert main(["train", *ARGS, "--nproc", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("leangnn: error: --nproc")


@pytest.mark.slow  # two CLI runs, one of them P fresh interpreters (~40 s)
def test_nproc_with_device_budget_equals_one_process(tmp_path):
    # Each rank runs its part through the offload engine under its budget.
    args = ["--model", "sage", "--dataset", "iscas85/c880", "--layers", "2",
            "--hidden", "8", "--epochs", "2", "--quiet"]
    assert main(["train", *args, "--out", str(tmp_path / "full")]) == 0
    assert main(["train", *args, "--nproc", "2", "--strategy", "distributed",
                 "--dist-mode", "graph", "--device-budget", "64MiB",
                 "--out", str(tmp_path / "dist")]) == 0
    full = json.loads((tmp_path / "full" / "summary.json").read_text())
    dist = json.loads((tmp_path / "dist" / "summary.json").read_text())
    per_rank = dist["distributed"]["offload_per_rank"]
    assert [r["device_budget"] for r in per_rank] == [64 << 20] * 2
    assert all(r["counters"]["jobs"] > 0 for r in per_rank)
    assert full["metrics"]["val"]
    for key, value in full["metrics"]["val"].items():
        assert dist["metrics"]["val"][key] == pytest.approx(value, rel=2e-3,
                                                            abs=1e-4)


def test_a_killed_job_resumes_on_every_rank(tmp_path):
    """`--resume` of a `--nproc` job: every rank restores the checkpoint rank
    0 wrote (the others, which write nothing, failed with 'this trainer keeps
    no run directory'); the resumed run ends where an uninterrupted one does."""
    args = ["--dataset", "csbm:600", "--model", "sage", "--layers", "2",
            "--hidden", "8", "--patience", "0", "--strategy", "distributed",
            "--nproc", "2", "--quiet"]
    run, whole = tmp_path / "run", tmp_path / "whole"
    assert main(["train", *args, "--epochs", "2", "--out", str(run)]) == 0
    assert main(["train", *args, "--epochs", "3", "--out", str(run), "--resume"]) == 0
    assert main(["train", *args, "--epochs", "3", "--out", str(whole)]) == 0
    metrics = [json.loads(m)["epoch"] for m in
               (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics == [1, 2, 3]
    a, b = (json.loads((p / "summary.json").read_text()) for p in (run, whole))
    assert a["epochs_run"] == 3
    assert a["metrics"]["test"] == pytest.approx(b["metrics"]["test"], rel=1e-6)
