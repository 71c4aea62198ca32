"""predict / evaluate: a trained run applied to circuits, read-only.

References: the run's own ``summary.json`` (evaluate must reproduce its test
metrics), a direct forward of a model built here from the checkpoint's
weights on :func:`load_circuit`'s features (the training path), and
:func:`read_netlist`'s node names.
"""

from __future__ import annotations

import csv
import json
import os
import shutil

import pytest
import torch

from leangnn.circuits import TASKS, catalog, load_circuit, read_netlist
from leangnn.cli import main
from leangnn.config import TrainConfig
from leangnn.nn.models import MODELS, build_model
from leangnn.predict import feature_names, netlist_graph, open_run
from leangnn.rundir import RunDir
from leangnn.train import Trainer

BASE = dict(dataset="iscas85/c17,iscas85/c432", test_dataset="iscas85/c880",
            num_layers=2, hidden_channels=8, epochs=2)
RUNS = {
    "critical": dict(task="critical"),  # full / res
    "reversible": dict(task="arrival", strategy="reversible", num_groups=2,
                       level_feature=True),
    "offload": dict(task="signal_prob", strategy="offload", num_parts=2),
    # the learned decoder whatever decoder="auto" would choose on this run
    "prune": dict(task="arrival", strategy="prune", decoder="learned"),
    # served by anchor averaging: no decoder, and none missing
    "prune-average": dict(task="arrival", strategy="prune", decoder="average"),
}
TEST = "iscas85/c880"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Trains each run of RUNS once, on first use; name -> (dir, trainer)."""
    root, done = tmp_path_factory.mktemp("runs"), {}

    def get(name):
        if name not in done:
            cfg = TrainConfig(**BASE, **RUNS[name], out=str(root / name))
            trainer = Trainer(cfg, progress=False)
            trainer.fit()
            done[name] = root / name, trainer
        return done[name]

    return get


def _netlist_path(name):
    return next(c.path for c in catalog() if c.name == name)


def _reference(run_dir, circuit):
    """Output of a model built here from the checkpoint's best weights, on the
    features training builds (load_circuit)."""
    cfg = TrainConfig.load(run_dir / "config.json")
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    data = load_circuit(circuit, cfg.task, level_feature=cfg.level_feature)
    out_ch = 4 if TASKS[cfg.task] == "classification" else 1
    model = build_model(cfg.model, data.num_features, cfg.hidden_channels, out_ch,
                        cfg.num_layers, **cfg.model_options())
    model.load_state_dict(ckpt["best_state"])
    model.eval()
    with torch.no_grad():
        return model(data.x, data.edge_index)


def _assert_close_metrics(got, want):
    assert set(got) == set(want)
    for k, v in want.items():
        assert (got[k] is None) == (v is None), k
        if v is not None:
            assert abs(got[k] - v) <= 1e-6, (k, got[k], v)


def _one_error(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("leangnn: error: "), err
    return err[0]


def _files(d):
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in d.iterdir()}


# ------------------------------------------------------------- evaluate
@pytest.mark.parametrize("name", ["critical", "reversible", "offload"])
def test_evaluate_reproduces_the_summary_test_metrics(runs, name, capsys):
    run_dir, _ = runs(name)
    before = _files(run_dir)
    assert main(["evaluate", "--run", str(run_dir), "--dataset", TEST,
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    summary = json.loads((run_dir / "summary.json").read_text())
    _assert_close_metrics(got, summary["metrics"]["test"])
    assert main(["evaluate", "--run", str(run_dir), "--dataset", TEST, "--quiet",
                 "--task", RUNS[name]["task"]]) == 0
    line = capsys.readouterr().out.strip()
    first = "accuracy" if name == "critical" else "pearson"
    assert line.startswith(f"leangnn evaluate: {first}=") and str(run_dir) in line
    assert _files(run_dir) == before  # read-only: nothing written


def test_prune_run_carries_its_fitted_decoder(runs, tmp_path, capsys):
    """DPR trains its decoder after the last epoch: the trainer's final
    checkpoint carries that state, so evaluate reproduces the summary; a
    checkpoint without it (an older run) is refused."""
    run_dir, trainer = runs("prune")
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["fitted_strategy"]["decoder"] is not None
    assert main(["evaluate", "--run", str(run_dir), "--dataset", TEST, "--json"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    _assert_close_metrics(json.loads(capsys.readouterr().out),
                          summary["metrics"]["test"])

    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    del ckpt["fitted_strategy"]
    torch.save(ckpt, old / "checkpoint.pt")
    assert main(["evaluate", "--run", str(old), "--dataset", TEST]) == 2
    assert "decoder was trained after its last checkpoint" in _one_error(capsys)


def test_prune_run_without_a_decoder_is_served(runs, capsys):
    """No decoder in the checkpoint is what such a run serves with (anchor
    averaging, as when decoder="auto" drops it), not a decoder missing from
    it: evaluate reproduces the summary."""
    run_dir, _ = runs("prune-average")
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    state = ckpt["fitted_strategy"]
    assert state["decoder"] is None and state["decoder_choice"] == "average"
    assert main(["evaluate", "--run", str(run_dir), "--dataset", TEST, "--json"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    _assert_close_metrics(json.loads(capsys.readouterr().out),
                          summary["metrics"]["test"])


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_registered_model_goes_through_the_same_path(model, tmp_path):
    """No model-specific code: whatever is registered (``dag`` included once
    it is) round-trips through open_run and reproduces the summary."""
    opts = {"num_groups": 2} if model in ("gsr", "res") else {}
    cfg = TrainConfig(dataset="iscas85/c17", test_dataset="iscas85/c432",
                      num_layers=2, hidden_channels=8, epochs=1, model=model,
                      out=str(tmp_path / model), **opts)
    summary = Trainer(cfg, progress=False).fit()
    run = open_run(tmp_path / model)
    _assert_close_metrics(run.evaluate(run.load(["iscas85/c432"])),
                          summary["metrics"]["test"])


# -------------------------------------------------------------- predict
def test_features_match_training(tmp_path):
    for name in ("iscas85/c17", "iscas89/s27", "misc/mux_4", "epfl/ctrl"):
        for level in (False, True):
            want = load_circuit(name, "arrival", level_feature=level)
            got, names = netlist_graph(name, level)
            assert torch.equal(got.x, want.x) and got.x.dtype == want.x.dtype
            assert got.x.size(1) == len(feature_names(level))
            assert torch.equal(got.edge_index, want.edge_index)
            assert torch.equal(got.level, want.level)
            assert torch.equal(got.is_output, want.is_output)
            assert (got.name, got.digest) == (want.name, want.digest)
            assert names == read_netlist(_netlist_path(name)).names


def test_predict_user_file_csv_classification(runs, tmp_path, capsys):
    run_dir, _ = runs("critical")
    mine = tmp_path / "mine.v"
    shutil.copy(_netlist_path("iscas85/c17"), mine)
    out = tmp_path / "pred.csv"
    assert main(["predict", "--run", str(run_dir), str(mine), "--out",
                 str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    net = read_netlist(mine)
    assert [r["net"] for r in rows] == net.names
    assert {r["circuit"] for r in rows} == {"user/mine"}
    probs = torch.tensor([[float(r[f"prob_{c}"]) for c in range(4)] for r in rows])
    assert torch.allclose(probs.sum(1), torch.ones(len(rows)), atol=1e-6)
    assert [int(r["class"]) for r in rows] == probs.argmax(1).tolist()
    ref = torch.softmax(_reference(run_dir, str(mine)), -1)
    assert torch.allclose(probs, ref, atol=1e-6, rtol=0)


def test_predict_json_regression_never_simulates(runs, tmp_path, monkeypatch):
    """A fresh netlist with > 16 inputs (c432 with a comment: a new content
    hash, so nothing is cached): predict must not compute labels."""
    run_dir, _ = runs("reversible")
    fresh = tmp_path / "fresh.v"
    fresh.write_text(open(_netlist_path("iscas85/c432")).read() + "\n// copy\n")
    assert read_netlist(fresh).inputs.size > 16
    out = tmp_path / "pred.json"

    def boom(*a, **k):
        raise AssertionError("predict computed labels")

    with monkeypatch.context() as m:
        for fn in ("signal_probability", "static_timing"):
            m.setattr(f"leangnn.circuits.dataset.{fn}", boom)
            m.setattr(f"leangnn.circuits.simulate.{fn}", boom)
        assert main(["predict", "--run", str(run_dir), str(fresh), "iscas85/c17",
                     "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["task"] == "arrival" and "critical-path delay" in doc["unit"]
    assert doc["weights"] == "best" and doc["finished"] is True
    assert doc["columns"] == ["circuit", "net", "arrival"]
    sizes = {"user/fresh": read_netlist(fresh).num_nodes, "iscas85/c17": 11}
    assert len(doc["rows"]) == sum(sizes.values())
    for circuit, path in (("user/fresh", str(fresh)), ("iscas85/c17", "iscas85/c17")):
        got = torch.tensor([r["arrival"] for r in doc["rows"]
                            if r["circuit"] == circuit])
        assert got.numel() == sizes[circuit]
        ref = _reference(run_dir, path).view(-1)
        assert torch.allclose(got, ref, atol=1e-6, rtol=0)


def test_predict_table_on_stdout_and_a_run_in_progress(runs, tmp_path, capsys):
    run_dir, _ = runs("offload")
    copy = tmp_path / "inprogress"
    shutil.copytree(run_dir, copy)
    (copy / "summary.json").unlink()
    # The run's lock is held (as by a running trainer): predict only reads.
    with RunDir(copy).open(resume=True):
        assert main(["predict", "--run", str(copy), "iscas85/c17,misc/mux_2"]) == 0
    cap = capsys.readouterr()
    assert "no summary.json" in cap.err
    lines = cap.out.splitlines()
    assert lines[0].startswith(f"# {copy}: offload/sage") and "not finished" in lines[0]
    assert lines[1].startswith("# signal_prob: probability")
    assert lines[2].split() == ["circuit", "net", "signal_prob"]
    n = 11 + read_netlist(_netlist_path("misc/mux_2")).num_nodes
    assert len(lines) == 3 + n
    ref = _reference(run_dir, "iscas85/c17").view(-1)
    got = torch.tensor([float(ln.split()[2]) for ln in lines[3:14]])
    assert torch.allclose(got, ref, atol=1e-4, rtol=0)  # 4 decimals printed


# --------------------------------------------------------------- errors
def _bad_runs(root, good):
    """Name -> run dir broken in one way."""
    out = {}
    out["empty"] = root / "empty"
    out["empty"].mkdir()
    for name in ("corrupt", "unsafe", "layout", "nockpt"):
        shutil.copytree(good, root / name)
        out[name] = root / name
    (out["corrupt"] / "checkpoint.pt").write_bytes(b"\x80\x02garbage" * 10)
    ckpt = torch.load(good / "checkpoint.pt", weights_only=True)
    import argparse

    torch.save({**ckpt, "extra": argparse.Namespace(a=1)},
               out["unsafe"] / "checkpoint.pt")
    # A run of another feature layout: the level feature switched on in its
    # config and checkpoint, its weights still for the 15 features.
    cfg = json.loads((good / "config.json").read_text())
    (out["layout"] / "config.json").write_text(
        json.dumps({**cfg, "level_feature": True}))
    torch.save({**ckpt, "config": {**ckpt["config"], "level_feature": True}},
               out["layout"] / "checkpoint.pt")
    (out["nockpt"] / "checkpoint.pt").unlink()
    (out["nockpt"] / "checkpoint.prev.pt").unlink(missing_ok=True)
    return out


def test_bad_inputs_exit_2_with_one_line(runs, tmp_path, capsys):
    run_dir, _ = runs("critical")
    bad = _bad_runs(tmp_path, run_dir)
    badv = tmp_path / "bad.v"
    badv.write_text("module m(a, y);\n input a; output y;\n frob g (y, a);\n"
                    "endmodule\n")
    p = ["predict", "--run", str(run_dir)]
    cases = [
        (["predict", "--run", str(bad["empty"]), "iscas85/c17"],
         "is not a leangnn run directory (config.json is missing)"),
        (["evaluate", "--run", str(tmp_path / "nope"), "--dataset", TEST],
         "no run directory at"),
        (["predict", "--run", str(badv), "iscas85/c17"], "is not a directory"),
        (["predict", "--run", str(bad["nockpt"]), "iscas85/c17"],
         "holds no checkpoint yet"),
        (["predict", "--run", str(bad["corrupt"]), "iscas85/c17"], "unreadable"),
        (["evaluate", "--run", str(bad["unsafe"]), "--dataset", TEST],
         "refused: it holds argparse.Namespace"),
        (["predict", "--run", str(bad["layout"]), "iscas85/c17"],
         "another feature layout"),
        (["evaluate", "--run", str(run_dir), "--dataset", TEST, "--task", "arrival"],
         "was trained for task 'critical', got 'arrival'"),
        ([*p, str(badv)], f"{badv}:3: unknown gate type 'frob'"),
        ([*p, str(tmp_path / "missing.v")], "no such netlist file"),
        ([*p, "nosuchcircuit"], "NETLIST: unknown circuit or suite 'nosuchcircuit'"),
        (["evaluate", "--run", str(run_dir), "--dataset", "zz"],
         "--dataset: unknown circuit or suite 'zz'"),
        ([*p, "iscas85/c17", "--out", str(tmp_path / "x.txt")],
         "--out: expected a .csv or .json file"),
        (["predict", "iscas85/c17"], "the following arguments are required: --run"),
        (["evaluate", "--run", str(run_dir)], "required: --dataset"),
    ]
    for argv, want in cases:
        assert main(argv) == 2, argv
        line = _one_error(capsys)
        assert want in line, (argv, line)


@pytest.mark.slow  # a launched rank: a fresh interpreter (~15 s)
def test_distributed_run_is_served_in_one_process(tmp_path, capsys):
    """predict and evaluate on a ``--strategy distributed`` run raised a bare
    ``RuntimeError: DistributedStrategy: call setup() first``; one process
    serves it with the full-batch forward, which the distributed one equals:
    evaluate reproduces the run's own test metrics."""
    run = tmp_path / "dist"
    assert main(["train", "--strategy", "distributed", "--nproc", "1", "--model",
                 "res", "--dataset", "iscas85/c17,iscas85/c432", "--test-dataset",
                 TEST, "--layers", "2", "--hidden", "8", "--epochs", "2",
                 "--quiet", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--dataset", TEST, "--json",
                 "--quiet"]) == 0
    got = json.loads(capsys.readouterr().out)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["strategy"] == "distributed"
    _assert_close_metrics(got, summary["metrics"]["test"])
    out = tmp_path / "pred.csv"
    assert main(["predict", "--run", str(run), TEST, "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    want = _reference(run, TEST).view(-1)
    assert [r["net"] for r in rows] == read_netlist(_netlist_path(TEST)).names
    assert torch.allclose(torch.tensor([float(r["arrival"]) for r in rows]), want,
                          atol=1e-5)


def test_predict_refuses_a_graph_it_was_not_trained_for(runs):
    """A graph of another feature width raised a bare matmul error, and NaN
    features came back as NaN predictions; both are one ValueError naming
    the tensor (the Python path: the CLI builds features from netlists)."""
    run = open_run(runs("critical")[0])
    data, _ = netlist_graph("iscas85/c17")
    assert run.predict(data).shape == (data.num_nodes, 4)
    wide = data.clone()
    wide.x = torch.cat([wide.x, torch.ones(wide.num_nodes, 1)], 1)
    with pytest.raises(ValueError, match=r"^graph 'iscas85/c17': x has "
                       rf"{run.in_channels + 1} features per node, the model takes "
                       rf"{run.in_channels}$"):
        run.predict(wide)
    bad = data.clone()
    bad.x[2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"x has 1 non-finite \(NaN or Inf\) "
                       r"entries of \d+, the first at \[node, feature\] \[2, 0\]"):
        run.predict(bad)
    labelled = run.load("iscas85/c17")
    labelled[0].y[0] = 7
    with pytest.raises(ValueError, match=r"^graph 0 'iscas85/c17': y must hold "
                       r"class ids in \[0, 4\)"):
        run.evaluate(labelled)


def test_predict_out_is_checked_before_the_work(runs, tmp_path, monkeypatch,
                                                capsys):
    """An --out that cannot be written failed after every prediction was
    computed, with a bare ``[Errno ...]`` naming a temporary file; it is now
    refused first, naming --out, and a write that fails anyway names it too."""
    import leangnn.predict

    run_dir, _ = runs("critical")
    blocker = tmp_path / "file"
    blocker.write_text("x")

    def no_work(*a, **k):
        raise AssertionError("predicted before checking --out")

    with monkeypatch.context() as m:
        m.setattr(leangnn.predict, "open_run", no_work)
        for out in [blocker / "p.csv", blocker / "sub" / "p.json"]:
            assert main(["predict", "--run", str(run_dir), "iscas85/c17", "--out",
                         str(out)]) == 2
            assert _one_error(capsys) == (
                f"leangnn: error: --out: cannot create '{out}': '{blocker}' is not "
                "a writable directory")

    def refuse(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path) + ".tmp")

    monkeypatch.setattr("leangnn.utils.atomic_write_text", refuse)
    out = tmp_path / "new" / "p.csv"
    assert main(["predict", "--run", str(run_dir), "iscas85/c17", "--out",
                 str(out)]) == 2
    assert _one_error(capsys) == (f"leangnn: error: --out: cannot write '{out}' "
                                  "(Permission denied)")
    assert blocker.read_text() == "x" and not out.exists()


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_bad_device_is_named_as_the_option(runs, command, capsys):
    """--device tpu was reported as '<run>/config.json: device: ...', as if the
    run's saved configuration were damaged."""
    run_dir, _ = runs("critical")
    tail = ["iscas85/c17"] if command == "predict" else ["--dataset", "iscas85/c17"]
    for device in ("tpu", "", "cuda:x"):
        assert main([command, "--run", str(run_dir), "--device", device, *tail]) == 2
        assert _one_error(capsys) == ("leangnn: error: --device: expected cpu, cuda "
                                      f"or cuda:i, got {device!r}")


def test_predict_out_never_overwrites_the_run_itself(runs, tmp_path, monkeypatch,
                                                     capsys):
    """`--out RUN/summary.json` replaced the run's summary with predictions
    (and RUN/config.json its configuration): the run was lost."""
    run_dir, _ = runs("critical")
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    monkeypatch.chdir(tmp_path)
    for out in [run / "summary.json", run / "config.json", "run/summary.json",
                run / ".." / "run" / "config.json"]:
        assert main(["predict", "--run", str(run), "iscas85/c17", "--out",
                     str(out)]) == 2
        name = os.path.basename(str(out))
        assert _one_error(capsys) == (f"leangnn: error: --out: {str(out)!r} is the "
                                      f"run's own {name}, which predictions would "
                                      "overwrite; choose another file")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    # any other file in the run folder is fine
    assert main(["predict", "--run", "run", "iscas85/c17", "--out",
                 "run/pred.json"]) == 0
    assert json.loads((run / "pred.json").read_text())["task"] == "critical"
