"""The command line: contract names, output, clear errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

from leangnn.circuits import catalog
from leangnn.cli import main

SMALL = ["--dataset", "iscas85/c17,misc/mux_4,epfl/ctrl", "--val-dataset", "misc/mux_2",
         "--test-dataset", "misc/switch", "--layers", "2", "--hidden", "8", "--quiet"]


def test_datasets_json_lists_every_bundled_circuit(capsys):
    assert main(["datasets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == [c.name for c in catalog()]
    b19 = next(r for r in rows if r["name"] == "itc99/b19")
    assert b19["nodes"] > 100_000 and b19["depth"] > 50
    for r in rows:
        assert set(r) == {"name", "suite", "nodes", "edges", "depth", "inputs",
                          "outputs"}
        assert r["nodes"] > 0 and r["inputs"] > 0 and r["outputs"] > 0


def test_datasets_table(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["name", "suite", "nodes", "edges", "depth", "inputs",
                              "outputs"]
    assert len(out) == len(catalog()) + 2


def test_train_then_resume(tmp_path, capsys):
    run = str(tmp_path / "run")
    assert main(["train", *SMALL, "--epochs", "2", "--out", run]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("leangnn train: test pearson=") and run in line
    assert main(["train", "--out", run, "--resume", "--epochs", "3", "--quiet"]) == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["epochs_run"] == 3 and s["num_layers"] == 2
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["epoch"] for ln in lines] == [1, 2, 3]


def test_reversible_flags_reach_the_model_and_the_run_resumes(tmp_path):
    """--strategy reversible --model gsr with its flags; the flat layout and its
    off switch train the same numbers (same seed), and a flat run resumes."""
    summaries = {}
    for flat in (True, False):
        run = tmp_path / f"gsr-{flat}"
        flags = [] if flat else ["--no-flat-parameters"]
        assert main(["train", *SMALL, "--strategy", "reversible", "--model", "gsr",
                     "--layers", "6", "--groups", "2", "--sparsity", "2",
                     "--epochs", "2", "--out", str(run), *flags]) == 0
        summaries[flat] = json.loads((run / "summary.json").read_text())
        cfg = json.loads((run / "config.json").read_text())
        assert (cfg["num_groups"], cfg["sparsity"], cfg["flat_parameters"]) == \
            (2, 2, flat)
    a, b = summaries[True], summaries[False]
    assert (a["strategy"], a["model"], a["num_layers"]) == ("reversible", "gsr", 6)
    assert a["num_parameters"] == b["num_parameters"]
    for key, value in b["metrics"]["test"].items():
        assert abs(a["metrics"]["test"][key] - value) <= 1e-5 * max(1, abs(value))
    run = str(tmp_path / "gsr-True")
    assert main(["train", "--out", run, "--resume", "--epochs", "3", "--quiet"]) == 0
    assert json.loads((tmp_path / "gsr-True" / "summary.json").read_text())[
        "epochs_run"] == 3


def test_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["train", *SMALL, "--layers", "0", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "num_layers: expected a positive integer, got 0" in err
    assert "Traceback" not in err

    assert main(["train", "--dataset", "nope", "--quiet"]) == 2
    assert "unknown circuit or suite 'nope'" in capsys.readouterr().err

    assert main(["train", "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert "--resume: no run at" in capsys.readouterr().err

    bad = tmp_path / "bad.v"
    bad.write_text("module m(a, y);\n input a; output y;\n frob g (y, a);\nendmodule\n")
    assert main(["train", "--dataset", str(bad), "--test-dataset", "misc/switch",
                 "--quiet", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: unknown gate type 'frob'" in err

    run = str(tmp_path / "r2")
    assert main(["train", *SMALL, "--epochs", "1", "--out", run]) == 0
    capsys.readouterr()
    assert main(["train", "--out", run, "--resume", "--layers", "5", "--quiet"]) == 2
    assert "differ from the saved run" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "leangnn", "train", "--help"],
                       capture_output=True, text=True, check=True)
    for flag in ("--dataset", "--test-dataset", "--task", "--strategy", "--model",
                 "--layers", "--hidden", "--epochs", "--lr", "--seed", "--device",
                 "--out", "--resume"):
        assert flag in r.stdout
