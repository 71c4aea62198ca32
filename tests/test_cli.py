"""The command line: contract names, output, clear errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

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


# ------------------------------------------------------- bad invocations
# Every one exits 2 with exactly one ``leangnn: error:`` line naming the
# problem, and fails before training (most before any data is loaded).
# {tmp}: a folder of prepared files; {run}: a run folder whose config.json
# holds the case's ``config`` text.
_T = ["train", "--quiet"]
_R = [*_T, "--model", "res"]  # a model with groups and sparsity
BAD = [
    # (argv, what the error line must contain, loads data first)
    ([], "the following arguments are required: command", False),
    (["bogus"], "invalid choice: 'bogus'", False),
    (["datasets", "--bogus"], "unrecognized arguments: --bogus", False),
    ([*_T, "--no-such-flag"], "unrecognized arguments: --no-such-flag", False),
    ([*_T, "--layers"], "argument --layers: expected one argument", False),
    ([*_T, "--layers", "abc"], "argument --layers: invalid int value: 'abc'", False),
    ([*_T, "--hidden", "1e9"], "argument --hidden: invalid int value: '1e9'", False),
    ([*_T, "--epochs", "2.5"], "argument --epochs: invalid int value: '2.5'", False),
    ([*_T, "--lr", "fast"], "argument --lr: invalid float value: 'fast'", False),
    ([*_T, "--model", "mlp"], "argument --model: invalid choice: 'mlp'", False),
    ([*_T, "--strategy", "magic"], "argument --strategy: invalid choice", False),
    ([*_T, "--conv", "gin"], "argument --conv: invalid choice: 'gin'", False),
    ([*_T, "--task", "power"], "argument --task: invalid choice: 'power'", False),
    ([*_T, "--cache", "fifo"], "argument --cache: invalid choice: 'fifo'", False),
    ([*_T, "--offload-mode", "fast"], "argument --offload-mode: invalid choice",
     False),
    # numbers out of range, infinite, not a number
    ([*_T, "--layers", "0"], "num_layers: expected a positive integer, got 0", False),
    ([*_T, "--layers", "-3"], "num_layers: expected a positive integer, got -3",
     False),
    ([*_R, "--layers", "1000000000"], "model 'res' would have ~8.38e+12 parameters",
     False),
    ([*_T, "--hidden", "0"], "hidden_channels: expected a positive integer", False),
    ([*_R, "--hidden", "1000000000"], "hidden_channels=1000000000: model 'res' "
     "would have", False),
    ([*_T, "--epochs", "0"], "epochs: expected a positive integer, got 0", False),
    ([*_T, "--dropout", "1"], "dropout: expected a value in [0, 1), got 1.0", False),
    ([*_T, "--dropout", "-0.5"], "dropout: expected a value in [0, 1), got -0.5",
     False),
    ([*_T, "--dropout", "nan"], "dropout: expected a finite number, got nan", False),
    ([*_T, "--lr", "0"], "lr: expected a positive learning rate, got 0.0", False),
    ([*_T, "--lr", "-1"], "lr: expected a positive learning rate, got -1.0", False),
    ([*_T, "--lr", "inf"], "lr: expected a finite number, got inf", False),
    ([*_T, "--lr", "nan"], "lr: expected a finite number, got nan", False),
    ([*_T, "--weight-decay", "inf"], "weight_decay: expected a finite number", False),
    ([*_T, "--weight-decay", "-1"], "weight_decay: expected a value >= 0", False),
    ([*_T, "--clip-norm", "-1"], "clip_norm: expected a norm >= 0", False),
    ([*_T, "--clip-norm", "nan"], "clip_norm: expected a finite number, got nan",
     False),
    ([*_T, "--clip-norm", "inf"], "clip_norm: expected a finite number, got inf",
     False),
    ([*_T, "--patience", "-1"], "patience: expected an integer >= 0, got -1", False),
    ([*_T, "--seed", "-1"], "seed: expected an integer in [0, 2**32), got -1", False),
    ([*_T, "--seed", str(2**40)], "seed: expected an integer in [0, 2**32)", False),
    ([*_T, "--groups", "0"], "num_groups: expected a positive integer, got 0", False),
    ([*_R, "--groups", "3"], "model 'res': num_groups must be a positive divisor of "
     "hidden_channels=64, got 3", False),
    ([*_T, "--strategy", "reversible", "--groups", "1"], "model 'gsr': num_groups "
     "must be an int >= 2, got 1", False),
    ([*_T, "--sparsity", "0"], "sparsity: expected an integer >= 1", False),
    ([*_R, "--sparsity", "17"], "model 'res': sparsity (winners per group) must be "
     "in [1, 16]", False),
    ([*_T, "--budget-ratio", "0"], "budget_ratio: expected a ratio in (0, 1]", False),
    ([*_T, "--budget-ratio", "1.5"], "budget_ratio: expected a ratio in (0, 1]",
     False),
    ([*_T, "--budget-ratio", "nan"], "budget_ratio: expected a finite number", False),
    ([*_T, "--anchors", "0"], "num_anchors: expected a positive integer", False),
    ([*_T, "--parts", "0"], "num_parts: expected a positive integer, got 0", False),
    ([*_T, "--device-budget", "0GiB"], "device_budget: cannot read '0GiB'", False),
    ([*_T, "--device-budget", "abc"], "device_budget: cannot read 'abc'", False),
    ([*_T, "--device-budget=-1GB"], "device_budget: cannot read '-1GB'", False),
    ([*_T, "--device-budget", "-1GB"], "device_budget: cannot read '-1GB'", False),
    ([*_T, "--device-budget", "1e3.5G"], "device_budget: cannot read '1e3.5G'", False),
    ([*_T, "--device-budget", "2 parsecs"], "device_budget: cannot read", False),
    ([*_T, "--device-budget", "99999999TiB"], "device_budget: expected a size below "
     "1 EiB", False),
    # devices
    ([*_T, "--device", "tpu"], "device: expected cpu, cuda or cuda:i, got 'tpu'",
     False),
    ([*_T, "--device", "cuda:abc"], "got 'cuda:abc'", False),
    ([*_T, "--device", ""], "device: expected cpu, cuda or cuda:i, got ''", False),
    ([*_T, "--device", "meta"], "device: expected cpu, cuda or cuda:i, got 'meta'",
     False),
    ([*_T, "--device", "CPU"], "device: expected cpu, cuda or cuda:i, got 'CPU'",
     False),
    ([*_T, "--device", "cuda:99"], "device: 'cuda:99' requested but", False),
    # datasets
    ([*_T, "--dataset", "csbm:inf"], "expected csbm:NUM_NODES, got 'csbm:inf'", False),
    ([*_T, "--dataset", "csbm:1e12"], "expected csbm:NUM_NODES, got 'csbm:1e12'",
     False),
    ([*_T, "--dataset", "csbm:-5"], "expected csbm:NUM_NODES, got 'csbm:-5'", False),
    ([*_T, "--dataset", "csbm:"], "expected csbm:NUM_NODES, got 'csbm:'", False),
    ([*_T, "--dataset", "csbm:many"], "expected csbm:NUM_NODES", False),
    ([*_T, "--dataset", "csbm:10"], "expected csbm:NUM_NODES, got 'csbm:10'", False),
    ([*_T, "--dataset", "csbm:500", "--test-dataset", "c17"],
     "test_dataset: expected no value with dataset='csbm:500'", False),
    ([*_T, "--test-dataset", "csbm:500"], "test_dataset: expected circuits", False),
    ([*_T, "--dataset", ""], "dataset: expected a non-empty value", False),
    ([*_T, "--dataset", ","], "dataset: ',' names no circuit", False),
    ([*_T, "--dataset", "nope"], "dataset: unknown circuit or suite 'nope'", False),
    ([*_T, "--dataset", "c17", "--val-dataset", "nope"],
     "val_dataset: unknown circuit or suite 'nope'", False),
    ([*_T, "--dataset", "c17", "--test-dataset", "c17"],
     "test_dataset: circuits ['iscas85/c17'] are also in the training set", False),
    ([*_T, "--dataset", "{tmp}/missing.v"], "{tmp}/missing.v: no such netlist file",
     False),
    ([*_T, "--dataset", "{tmp}/folder.v"], "{tmp}/folder.v: no such netlist file",
     False),
    ([*_T, "--dataset", "{tmp}"], "unknown circuit or suite '{tmp}'", False),
    ([*_T, "--dataset", "{tmp}/empty.v"], "{tmp}/empty.v:1: no 'module' found", True),
    ([*_T, "--dataset", "{tmp}/empty.bench"], "{tmp}/empty.bench: no gates/nets",
     True),
    ([*_T, "--dataset", "{tmp}/bad.bench"], "{tmp}/bad.bench:1: cannot parse line",
     True),
    ([*_T, "--dataset", "{tmp}/foo.bench"], "{tmp}/foo.bench:3: unknown gate type "
     "'FOO'", True),
    # strategy / model conflicts
    ([*_T, "--strategy", "reversible", "--model", "res"],
     "strategy 'reversible' needs a reversible model (one of ['gsr']), got 'res'",
     False),
    ([*_T, "--strategy", "reversible", "--model", "sage"],
     "needs a reversible model", False),
    ([*_T, "--strategy", "offload", "--model", "gsr"],
     "strategy 'offload' needs a layerwise model", False),
    ([*_T, "--strategy", "offload", "--model", "res"], "needs a layerwise model",
     False),
    # too large for memory (8 GiB available in these tests)
    ([*_T, "--layers", "100000", "--hidden", "256"], "GiB of cpu memory (estimate: "
     "parameters and optimizer state", False),
    ([*_T, "--layers", "1000000000", "--hidden", "1", "--groups", "1"],
     "TiB of cpu memory (estimate", False),
    ([*_T, "--dataset", "csbm:1e8"], "dataset: csbm:100000000 needs ~190.7 GiB of "
     "host memory to generate", False),
    ([*_T, "--dataset", "csbm:3e6"], "activations 10.0 GiB", False),
    ([*_T, "--strategy", "offload", "--dataset", "csbm:2e6", "--layers", "64"],
     "model objects and host store 31.7 GiB), only 8.0 GiB available", False),
    # output folders and runs
    ([*_T, "--out", ""], "out: expected a non-empty value", False),
    ([*_T, "--out", "{tmp}/afile"], "--out: '{tmp}/afile' exists and is not a "
     "directory", False),
    ([*_T, "--out", "{tmp}/afile/run"], "--out: cannot create '{tmp}/afile/run'",
     False),
    ([*_T, "--out", "{tmp}/oldrun"], "--out: '{tmp}/oldrun' already holds a run "
     "(config.json)", False),
    ([*_T, "--resume"], "--resume needs --out DIR", False),
    ([*_T, "--resume", "--out", "{tmp}/nowhere"], "--resume: no run at", False),
    ([*_T, "--resume", "--out", "{tmp}"], "--resume: no run at", False),
    ([*_T, "--resume", "--force", "--out", "{tmp}/oldrun"], "pass one of them",
     False),
    ([*_T, "--resume", "--out", "{run}", "--layers", "5"],
     "--resume: options ['num_layers'] differ from the saved run", False),
    ([*_T, "--resume", "--out", "{run}", "--lr", "inf"],
     "--resume: options ['lr'] differ", False),
    ([*_T, "--resume", "--out", "{run}", "--epochs", "0"],
     "epochs: expected a positive integer, got 0", False),
    ([*_T, "--resume", "--out", "{run}"], "resume: no checkpoint", True),
]
# hand-edited config.json files a resume must refuse: (config text, error)
BAD_CONFIGS = [
    ("{", "config.json: not a JSON config"),
    ("", "config.json: not a JSON config"),
    ("\x00\xff\xfe", "config.json: not a JSON config"),
    ("[1, 2]", "config.json: expected a JSON object of config fields, got list"),
    ('"full"', "config.json: expected a JSON object of config fields, got str"),
    ({"num_layers": "8"}, "num_layers: expected an integer (or omitted), got '8'"),
    ({"num_layers": 2.0}, "num_layers: expected an integer (or omitted), got 2.0"),
    ({"hidden_channels": -4}, "hidden_channels: expected a positive integer, got -4"),
    ({"lr": "fast"}, "lr: expected a number (or omitted), got 'fast'"),
    ({"lr": float("inf")}, "lr: expected a finite number, got inf"),
    ({"dropout": [0.1]}, "dropout: expected a number, got [0.1]"),
    ({"flat_parameters": "yes"}, "flat_parameters: expected true or false"),
    ({"layerz": 3}, "unknown config keys ['layerz']"),
    ({"strategy": "reversible", "model": "res"}, "needs a reversible model"),
    ({"model": "transformer"}, "model: expected gsr, res, gcn, "),
    ({"device": "cuda:99"}, "device: 'cuda:99' requested but"),
    ({"device_budget": -5}, "device_budget: expected a string"),
    ({"dataset": "csbm:inf"}, "expected csbm:NUM_NODES"),
]
SMALL_CFG = {"dataset": "iscas85/c17", "val_dataset": "misc/mux_2",
             "test_dataset": "misc/switch", "num_layers": 2, "hidden_channels": 8,
             "epochs": 1}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-cli")
    (tmp / "empty.v").write_text("")
    (tmp / "empty.bench").write_text("")
    (tmp / "bad.bench").write_text("garbage here\n")
    (tmp / "foo.bench").write_text("INPUT(a)\nOUTPUT(y)\ny = FOO(a)\n")
    (tmp / "folder.v").mkdir()
    (tmp / "afile").write_text("not a folder\n")
    (tmp / "oldrun").mkdir()
    (tmp / "oldrun" / "config.json").write_text("{}\n")
    return tmp


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if data loading (``load=False``) or a training step
    (``load=True``) starts, and give the memory check a fixed 8 GiB."""
    import leangnn.data
    import leangnn.plan.fits
    import leangnn.strategy
    import leangnn.train

    monkeypatch.setattr(leangnn.plan.fits, "_host_available", lambda: 8 << 30)

    def guard(load: bool):
        def no_load(*a, **k):
            raise AssertionError("data loading started")

        def no_step(*a, **k):
            raise AssertionError("training started")

        if not load:
            monkeypatch.setattr(leangnn.train, "load_graphs", no_load)
            monkeypatch.setattr(leangnn.data, "load_graphs", no_load)
        monkeypatch.setattr(leangnn.strategy.Strategy, "train_step", no_step)
    return guard


def _assert_one_error_line(err: str, expect: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("leangnn: error: "), err
    assert expect in lines[0], err


def _fill(s: str, tmp, run) -> str:
    return s.replace("{tmp}", str(tmp)).replace("{run}", str(run))


@pytest.mark.parametrize("argv, expect, load", BAD,
                         ids=[" ".join(a[2:] if a[:1] == ["train"] else a) or
                              "<none>" for a, _, _ in BAD])
def test_bad_invocation_is_one_error_line(argv, expect, load, files, tmp_path,
                                          no_training, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(SMALL_CFG))
    no_training(load)
    assert main([_fill(a, files, run) for a in argv]) == 2
    _assert_one_error_line(capsys.readouterr().err, _fill(expect, files, run))


@pytest.mark.parametrize("config, expect", BAD_CONFIGS,
                         ids=[str(c)[:40] for c, _ in BAD_CONFIGS])
def test_resume_refuses_a_hand_edited_config(config, expect, tmp_path, no_training,
                                             capsys):
    run = tmp_path / "run"
    run.mkdir()
    text = config if isinstance(config, str) else json.dumps({**SMALL_CFG,
                                                             **config})
    (run / "config.json").write_text(text, encoding="latin-1")
    no_training(False)
    assert main(["train", "--quiet", "--resume", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    _assert_one_error_line(err, expect)
    assert str(run / "config.json") in err


def test_at_least_sixty_bad_invocations():
    assert len(BAD) + len(BAD_CONFIGS) >= 60


def test_sane_values_pass_validation(tmp_path, no_training):
    """The checks refuse nonsense only: boundary values and a device budget
    larger than this machine's memory get through to data loading."""
    no_training(False)
    for extra in (["--dropout", "0", "--clip-norm", "0", "--budget-ratio", "1",
                   "--patience", "0", "--seed", str(2**32 - 1)],
                  ["--strategy", "offload", "--device-budget", "1TB"],
                  ["--strategy", "prune", "--dataset", "csbm:100"],
                  ["--strategy", "reversible", "--layers", "1000"]):
        with pytest.raises(AssertionError, match="data loading started"):
            main([*_T, "--out", str(tmp_path / "fresh"), *extra])


def test_force_starts_a_run_over(tmp_path, capsys):
    run = str(tmp_path / "run")
    small = [*SMALL, "--epochs", "1", "--out", run]
    assert main(["train", *small]) == 0
    capsys.readouterr()
    assert main(["train", *small]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", *small, "--force"]) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())[
        "epochs_run"] == 1


def test_registered_model_is_a_cli_choice(capsys):
    from leangnn.nn.models import MODELS, ResGNN, register_model

    register_model("myres", ResGNN, description="a plugin model")
    try:
        assert main(["train", "--model", "myres", "--layers", "0"]) == 2
        # the choice is accepted; validation then names the bad layer count
        assert "num_layers: expected a positive integer" in capsys.readouterr().err
        assert main(["train", "--strategy", "reversible", "--model", "myres"]) == 2
        assert "needs a reversible model (one of ['gsr'])" in capsys.readouterr().err
    finally:
        MODELS.pop("myres")
    assert main(["train", "--model", "myres"]) == 2
    assert "invalid choice: 'myres'" in capsys.readouterr().err


def test_internal_errors_keep_their_traceback(monkeypatch):
    """Only user errors become one line; a bug still raises."""
    import leangnn.plan.fits

    def bug(*a, **k):
        raise KeyError("a bug")

    monkeypatch.setattr(leangnn.plan.fits, "check_fits", bug)
    with pytest.raises(KeyError, match="a bug"):
        main(["train", "--quiet"])


def test_resume_may_move_a_run_to_another_device(tmp_path, no_training):
    """A run saved with a device this machine lacks resumes with --device cpu:
    the override applies before the saved config is validated."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({**SMALL_CFG, "device": "cuda:99"}))
    no_training(False)
    with pytest.raises(AssertionError, match="data loading started"):
        main([*_T, "--resume", "--out", str(run), "--device", "cpu"])


@pytest.mark.parametrize("exc", [MemoryError(), torch.OutOfMemoryError(
    "CUDA out of memory. Tried to allocate 2.00 GiB.\nSee documentation")])
def test_out_of_memory_is_one_error_line(exc, monkeypatch, capsys):
    import leangnn.plan.fits

    def oom(*a, **k):
        raise exc

    monkeypatch.setattr(leangnn.plan.fits, "check_fits", oom)
    assert main(["train", "--quiet"]) == 2
    _assert_one_error_line(capsys.readouterr().err, "out of memory: ")


# ------------------------------------------------------------------ planner
_P = ["plan", "--quiet"]
PLAN_BAD = [
    # (argv, what the error line must contain); none loads data
    ([*_P, "--memory-budget", "4 parsecs"],
     "--memory-budget: cannot read '4 parsecs' as a positive size"),
    ([*_P, "--memory-budget=-1GiB"], "--memory-budget: cannot read '-1GiB'"),
    # a negative size without '=' is the option's value, not another option
    ([*_P, "--memory-budget", "-1GiB"], "--memory-budget: cannot read '-1GiB'"),
    ([*_P, "--memory-budget", "-nan"], "--memory-budget: cannot read '-nan'"),
    ([*_P, "--model", "sage", "--device-budget", "-2GiB"],
     "--device-budget: cannot read '-2GiB'"),
    ([*_P, "--memory-budget", "nan"], "--memory-budget: cannot read 'nan'"),
    ([*_T, "--strategy", "auto", "--memory-budget", "nan"],
     "--memory-budget: cannot read 'nan'"),
    ([*_T, "--memory-budget", "4GiB"], "--memory-budget: only with --strategy auto"),
    ([*_T, "--strategy", "auto", "--device-budget", "1GiB"],
     "device_budget: strategy 'auto' sets it from memory_budget"),
    ([*_P, "--layers", "0"], "num_layers: expected a positive integer, got 0"),
    ([*_P, "--strategy", "auto"], "argument --strategy: invalid choice: 'auto'"),
    ([*_P, "--strategy", "distributed"],
     "--strategy distributed: plan it with --nproc P (the job's processes)"),
    ([*_T, "--strategy", "auto", "--nproc", "2", "--resume", "--out", "{run}"],
     "--resume with --strategy auto --nproc: resume the run with the strategy"),
    ([*_P, "--nproc", "0"], "--nproc: expected a positive number of processes, got 0"),
    ([*_T, "--strategy", "auto", "--nproc", "1"],
     "--nproc 1 with --strategy auto: the planner plans one process without"),
    ([*_T, "--resume", "--out", "{run}", "--strategy", "auto"],
     "was not planned (strategy 'full'); drop --strategy auto"),
    ([*_P, "--model", "gsr", "--hidden", "32", "--groups", "3"],
     "model 'gsr': hidden_channels=32 must be divisible by num_groups=3"),
    ([*_P, "--model", "gsr", "--groups", "0"],
     "num_groups: expected a positive integer, got 0"),
    ([*_P, "--model", "sage", "--budget-ratio", "2"],
     "budget_ratio: expected a ratio in (0, 1], got 2.0"),
    ([*_P, "--model", "sage", "--device-budget", "0"],
     "--device-budget: cannot read '0' as a positive size"),
    ([*_P, "--model", "sage", "--strategy", "reversible"],
     "--strategy reversible: no configuration of model 'sage' to plan with it "
     "(the planner's rows for 'sage': ['full', 'offload', 'prune'])"),
    ([*_P, "--model", "sage", "--device-budget", "lots"],
     "--device-budget: cannot read 'lots'"),
]


@pytest.mark.parametrize("argv, expect", PLAN_BAD,
                         ids=[" ".join(a[2:]) for a, _ in PLAN_BAD])
def test_bad_plan_invocation_is_one_error_line(argv, expect, tmp_path, no_training,
                                               capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(SMALL_CFG))
    no_training(False)
    assert main([_fill(a, tmp_path, run) for a in argv]) == 2
    _assert_one_error_line(capsys.readouterr().err, expect)


_C17 = ["--dataset", "iscas85/c17", "--val-dataset", "misc/mux_2", "--test-dataset",
        "misc/switch", "--layers", "2", "--hidden", "8", "--quiet"]


def test_plan_table_json_and_budget_below_every_candidate(capsys):
    """The JSON has one row per candidate and the pick; with a budget one
    byte below the smallest need the table shows every row as not fitting,
    with no pick, and the error is one line naming that candidate and its
    need (exit 2)."""
    argv = ["plan", *_C17, "--model", "sage", "--strategy", "prune"]
    assert main([*argv, "--memory-budget", "1GiB", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    rows = table["rows"]
    assert [r["strategy"] for r in rows] == ["prune"] * 3
    assert [r["knobs"]["budget_ratio"] for r in rows] == [0.5, 0.3, 0.1]
    assert all(r["fits"] == (r["need_bytes"] <= 1 << 30) for r in rows)
    assert table["pick"] == rows[0]["label"]  # the largest core that fits
    assert [r["chosen"] for r in rows] == [True, False, False]

    low = min(rows, key=lambda r: r["need_bytes"])
    assert main([*argv, "--memory-budget", str(low["need_bytes"] - 1)]) == 2
    io = capsys.readouterr()
    _assert_one_error_line(io.err, f"the smallest, {low['label']}, needs")
    from leangnn.utils import format_bytes

    assert f"~{format_bytes(low['need_bytes'])}" in io.err
    out = io.out.strip().splitlines()
    assert out[0].split()[:4] == ["strategy", "knobs", "need", "fits"]
    assert len(out) == 1 + len(rows) + 1
    assert all(line.startswith("  prune") and " no " in line for line in out[1:-1])
    assert "budget_ratio=0.5" in out[1] and out[-1].endswith("pick: none fits")


def test_plan_shows_progress_over_its_rows_unless_quiet_or_json(capsys):
    """A large graph's DPR cores and partitions take minutes: the rows get a
    bar on stderr, which ``--quiet`` and ``--json`` (for tools) leave out,
    and the table (stdout) stays whole."""
    loud = [a for a in _C17 if a != "--quiet"]
    argv = ["plan", *loud, "--model", "sage", "--memory-budget", "1GiB"]
    assert main(argv) == 0
    io = capsys.readouterr()
    assert "plan: " in io.err and "row" in io.err and "plan: " not in io.out
    assert io.out.splitlines()[-1].startswith("budget 1.0 GiB on cpu")
    for quiet in (["--quiet"], ["--json"]):
        assert main([*argv, *quiet]) == 0
        assert "plan: " not in capsys.readouterr().err


def test_plan_keeps_the_knobs_the_user_gave(capsys):
    """``--groups`` / ``--parts`` / ``--device-budget`` / ``--budget-ratio``
    pin the planner's grid: every row of that kind takes the given value,
    the other strategies' rows are still there."""
    argv = ["plan", *_C17, "--memory-budget", "1GiB", "--json"]
    assert main([*argv, "--model", "gsr", "--groups", "4", "--strategy",
                 "reversible"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["knobs"]["num_groups"] for r in rows] == [4]
    assert main([*argv, "--model", "sage", "--parts", "4", "--device-budget",
                 "3MiB", "--budget-ratio", "0.2"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["strategy"] for r in rows} == {"full", "offload", "prune"}
    off = [r["knobs"] for r in rows if r["strategy"] == "offload"]
    assert [(k["device_budget"], k["num_parts"]) for k in off] == \
        [(str(3 << 20), 4)]
    assert [r["knobs"]["budget_ratio"] for r in rows if r["strategy"] == "prune"] \
        == [0.2]
    # unpinned, the grid: both group counts
    assert main([*argv, "--model", "gsr", "--strategy", "reversible"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["knobs"]["num_groups"] for r in rows] == [2, 4]


def test_plan_without_budget_uses_free_memory(monkeypatch, capsys):
    import leangnn.plan.fits

    monkeypatch.setattr(leangnn.plan.fits, "_host_available", lambda: 3 << 30)
    assert main(["plan", *_C17, "--model", "sage", "--strategy", "full"]) == 0
    io = capsys.readouterr()
    assert "no --memory-budget; planning for the free memory of cpu now, " \
        "3.0 GiB" in io.err
    assert io.out.strip().splitlines()[-1].startswith("budget 3.0 GiB on cpu")


def test_train_auto_records_the_plan_and_resumes(tmp_path, capsys):
    """--strategy auto under a budget that only the reversible twin and the
    cores fit trains the pick; config.json holds the resolved strategy,
    summary.json the plan beside the measured figures; the same command
    line resumes the run."""
    from leangnn.config import TrainConfig
    from leangnn.data import load_graphs
    from leangnn.plan.planner import plan_config, resumed_plan

    # (deep enough that the reversible twin needs less than full batch: on
    # c17 at 2 layers GSR's larger first-run constant decides, and it needs
    # more)
    small = {**SMALL_CFG, "dataset": "iscas85/c432", "num_layers": 16,
             "hidden_channels": 32}
    cfg = TrainConfig(**{**small, "strategy": "auto"})
    # (as the command plans: in the process that trains)
    table = plan_config(cfg, load_graphs(cfg, progress=False), "1GiB",
                        strategies=("full",), in_process=True)
    (full,) = table.rows
    budget = str(full.need_bytes - 1)
    run = tmp_path / "run"
    c432 = ["--dataset", "iscas85/c432", "--val-dataset", "misc/mux_2",
            "--test-dataset", "misc/switch", "--layers", "16", "--hidden", "32",
            "--quiet"]
    argv = ["train", *c432, "--strategy", "auto", "--memory-budget", budget,
            "--out", str(run)]
    assert main([*argv, "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    cfg = json.loads((run / "config.json").read_text())
    assert (cfg["strategy"], cfg["model"], cfg["memory_budget"]) == \
        ("reversible", "gsr", budget)
    s = json.loads((run / "summary.json").read_text())
    plan = s["plan"]
    assert (s["strategy"], s["model"]) == ("reversible", "gsr")
    assert plan["strategy"] == "reversible" and plan["kind"] == "model change"
    assert plan["memory_budget_bytes"] == int(budget)
    assert plan["estimated_peak_bytes"] <= int(budget)
    assert plan["knobs"]["num_groups"] == cfg["num_groups"]
    labels = {r["label"]: r for r in plan["rows"]}
    assert labels[full.label]["need_bytes"] == full.need_bytes
    assert not labels[full.label]["fits"] and labels[plan["pick"]]["fits"]
    # the measured peak sits beside the estimate (a tiny run in a process whose
    # heap earlier tests grew may add no resident bytes: 0 is a measurement)
    assert plan["estimated_epoch_seconds"] > 0 and s["memory"]["peak_bytes"] >= 0
    # the measured need beside the budget, counted as the planner counts it
    check = s["budget_check"]
    assert plan["estimated_fixed_bytes"] > 0  # model and graph, before the meter
    assert check["measured_need_bytes"] == s["memory"]["peak_bytes"] + \
        plan["estimated_fixed_bytes"]
    assert check["within_budget"] == (check["measured_need_bytes"] <= int(budget))
    assert check["estimated_need_bytes"] == plan["estimated_peak_bytes"]
    assert "leangnn train: planned reversible(" in out
    # the epoch estimate is one thread's: said where the run had more
    threads = s["env"]["num_threads"]
    assert f"on {threads} thread" in out
    assert ("estimated" in out and "for one thread" in out) == (threads > 1)
    # planned in this process: the share of the first-run constant the dry
    # runs paid is recorded, and a resumed process (no plan in it) pays it
    assert plan["in_process_bytes"] == table.in_process_bytes > 0
    capsys.readouterr()
    assert main([*argv, "--epochs", "2", "--resume"]) == 0
    s2 = json.loads((run / "summary.json").read_text())
    share = plan["in_process_bytes"]
    assert s2["epochs_run"] == 2 and s2["plan"] == resumed_plan(plan)
    assert s2["plan"]["resumed_bytes"] == share
    assert s2["plan"]["estimated_peak_bytes"] == plan["estimated_peak_bytes"] + share
    assert s2["budget_check"]["estimated_need_bytes"] == \
        plan["estimated_peak_bytes"] + share
    warned = "resumed apart from its plan" in capsys.readouterr().err
    assert warned == (plan["estimated_peak_bytes"] + share > int(budget))
    assert json.loads((run / "config.json").read_text())["strategy"] == "reversible"
    assert json.loads((run / "plan.json").read_text()) == plan
    # a fresh, unplanned run over it (--force) leaves no stale plan behind
    assert main(["train", *_C17, "--out", str(run), "--force", "--epochs", "1"]) == 0
    assert not (run / "plan.json").exists()
    assert "plan" not in json.loads((run / "summary.json").read_text())


def test_auto_plans_and_trains_the_dag_model(tmp_path, capsys):
    """The DAG model (the default of --strategy full) is planned from a dry
    run of a few of its levels: one full-batch row (DPR's core keeps no
    levels), and --strategy auto trains it with the estimate recorded; a
    budget below it is one error line naming its need."""
    argv = ["plan", *_C17, "--model", "dag", "--dataset", "iscas85/c880,iscas85/c432"]
    assert main([*argv, "--memory-budget", "1GiB", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert (row["strategy"], row["fits"], row["chosen"]) == ("full", True, True)
    assert row["knobs"]["model"] == "dag" and row["epoch_seconds"] > 0
    assert main([*argv, "--memory-budget", str(row["need_bytes"] - 1)]) == 2
    _assert_one_error_line(capsys.readouterr().err, "needs")
    run = tmp_path / "run"
    assert main(["train", *_C17, "--model", "dag", "--strategy", "auto",
                 "--memory-budget", "1GiB", "--epochs", "1", "--out", str(run)]) == 0
    s = json.loads((run / "summary.json").read_text())
    assert (s["strategy"], s["model"]) == ("full", "dag")
    assert s["plan"]["estimated_peak_bytes"] > 0


def test_auto_plans_a_job_of_several_processes(tmp_path, capfd):
    """`--nproc 2` with --strategy auto: the launcher plans the distributed
    rows (each rank's part traced), trains the pick on two ranks and their
    summary records each rank's estimate beside its measured peak."""
    argv = ["--dataset", "csbm:600", "--model", "sage", "--layers", "2",
            "--hidden", "16", "--epochs", "2", "--memory-budget", "4GiB", "--quiet"]
    assert main(["plan", *argv, "--nproc", "2", "--json"]) == 0
    rows = json.loads(capfd.readouterr().out)["rows"]
    assert [r["knobs"]["dist_mode"] for r in rows] == ["graph", "data"]
    assert all(r["knobs"]["nproc"] == 2 for r in rows)
    graph = rows[0]
    ranks = graph["estimate"]["ranks"]
    assert sum(r["owned"] for r in ranks) == 600
    # on a CPU the ranks share the host: the row needs the ranks' sum
    assert graph["need_bytes"] >= sum(r["peak_bytes"] for r in ranks)
    run = tmp_path / "run"
    assert main(["train", *argv, "--strategy", "auto", "--nproc", "2",
                 "--out", str(run)]) == 0
    s = json.loads((run / "summary.json").read_text())
    assert s["strategy"] == "distributed" and s["plan"]["strategy"] == "distributed"
    assert json.loads((run / "config.json").read_text())["dist_mode"] == \
        s["distributed"]["mode"] == s["plan"]["knobs"]["dist_mode"]
    assert [r["rank"] for r in s["plan"]["ranks"]] == [0, 1]
    measured = s["distributed"]["records_per_rank"]
    assert [len(r) for r in measured] == [2, 2]
    assert all(0 <= e["run_peak_bytes"] <= e["peak_bytes"] for r in measured
               for e in r)
    assert "leangnn train: planned distributed(" in capfd.readouterr().out
    # nothing fits: one line naming the smallest row, and no rank started
    tiny = tmp_path / "tiny"
    assert main(["train", *argv, "--memory-budget", "1KiB", "--strategy", "auto",
                 "--nproc", "2", "--out", str(tiny)]) == 2
    _assert_one_error_line(capfd.readouterr().err, "memory_budget=1.0 KiB is below "
                           "every candidate on cpu: the smallest, distributed(")
    assert not tiny.exists()


def test_only_rank_0_checks_a_fresh_out(tmp_path, monkeypatch, capsys):
    """`--nproc 3`: rank 1 checked --out after rank 0 had written config.json
    there and refused 'already holds a run', killing the job (a race, seen
    with three ranks). Rank 0 alone writes the run, so it alone checks."""
    import leangnn.train

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}")  # what rank 0 wrote a moment ago
    (out / "metrics.jsonl").write_text("")
    reached = []

    class Stop(Exception):
        pass

    def trainer(cfg, **kw):
        reached.append(cfg.out)
        raise Stop

    monkeypatch.setattr(leangnn.train, "Trainer", trainer)
    argv = ["train", "--dataset", "iscas85/c17", "--test-dataset", "iscas85/c432",
            "--epochs", "1", "--quiet", "--out", str(out)]
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(Stop):
        main(argv)
    assert reached == [str(out)]
    monkeypatch.setenv("RANK", "0")  # rank 0 (and a plain run) still refuses
    assert main(argv) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_a_reader_that_leaves_the_pipe_ends_quietly(tmp_path, monkeypatch, capsys):
    """`leangnn predict ... | head -2` printed 'leangnn: error: [Errno 32] Broken
    pipe' with status 2; like other Unix tools it now stops quietly (141). A
    broken pipe that is not stdout's is still one error line."""
    run = tmp_path / "run"
    assert main(["train", "--dataset", "iscas85/c17", "--test-dataset", "misc/mux_2",
                 "--model", "res", "--layers", "1", "--hidden", "4", "--epochs", "1",
                 "--quiet", "--out", str(run)]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "leangnn", "predict", "--run",
                             str(run), "epfl/sin"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"# ")
    proc.stdout.close()  # what `head -1` does (7679 rows: more than a pipe holds)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert err == ""

    import leangnn.cli

    def peer_gone(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(leangnn.cli, "_datasets", peer_gone)
    capsys.readouterr()
    assert main(["datasets"]) == 2
    assert capsys.readouterr().err == "leangnn: error: [Errno 32] Broken pipe\n"


def test_train_auto_warns_when_the_run_needed_more_than_its_budget(
        tmp_path, capsys, monkeypatch):
    """A planned run whose measured need passes its budget finishes and says
    so in one stderr line, with both figures in summary.json."""
    import leangnn.plan.planner as planner

    real = planner.budget_check

    def over(plan, peak, setup=None):
        c = real(plan, peak, setup)
        return {**c, "measured_need_bytes": c["memory_budget_bytes"] + (3 << 20),
                "within_budget": False}

    monkeypatch.setattr(planner, "budget_check", over)
    run = tmp_path / "run"
    assert main(["train", *_C17, "--strategy", "auto", "--memory-budget", "1GiB",
                 "--epochs", "1", "--out", str(run)]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(lines) == 1
    assert "leangnn train: warning: this run needed ~1.0 GiB" in lines[0]
    assert "above --memory-budget 1.0 GiB" in lines[0]
    s = json.loads((run / "summary.json").read_text())
    assert s["budget_check"]["within_budget"] is False
    # within the budget: no warning
    monkeypatch.setattr(planner, "budget_check", real)
    assert main(["train", *_C17, "--strategy", "auto", "--memory-budget", "1GiB",
                 "--epochs", "1", "--out", str(run), "--force"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("after", [0.3, 1.0, 1.5, 2.0])
def test_ctrl_c_while_the_command_starts_is_one_line(after, tmp_path):
    # its imports (torch, PyG) take seconds: an interrupt there is the
    # user's, answered as one during training is, not with a traceback
    import signal
    import time

    # (a runner that started this process in the background passes SIGINT on
    # ignored, and Python then installs no handler: the child gets the default)
    # (epochs enough that no machine finishes before the signal)
    proc = subprocess.Popen([sys.executable, "-m", "leangnn", "train", "--epochs",
                             "50", "--out", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                             signal.SIG_DFL))
    time.sleep(after)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "leangnn: interrupted"
