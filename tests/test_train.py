"""Trainer: determinism, resume, early stopping, clipping, run directory."""

from __future__ import annotations

import json

import pytest
import torch

from leangnn.config import TrainConfig
from leangnn.data import GraphSplits, load_graphs, with_mask
from leangnn.rundir import RunDirError
from leangnn.strategy import FullBatch
from leangnn.train import Trainer, make_loss_fn

TINY = dict(dataset="iscas85/c17,misc/mux_4,epfl/ctrl,misc/c17_gates",
            val_dataset="misc/mux_2", test_dataset="misc/switch,iscas85g/c17g",
            model="res", num_layers=2, hidden_channels=8, epochs=4, patience=0)


def _run(tmp_path, name, resume=False, **kw):
    cfg = TrainConfig(**{**TINY, **kw, "out": str(tmp_path / name)})
    return Trainer(cfg, progress=False).fit(resume=resume)


def _lines(path):
    out = []
    for ln in path.read_text().splitlines():
        rec = json.loads(ln)
        rec.pop("epoch_seconds")
        rec.pop("epoch_cpu_seconds")
        rec.pop("peak_bytes")  # memory: not deterministic
        out.append(rec)
    return out


def test_same_seed_same_metrics(tmp_path):
    a = _run(tmp_path, "a", dropout=0.1)
    b = _run(tmp_path, "b", dropout=0.1)
    assert _lines(tmp_path / "a" / "metrics.jsonl") == _lines(
        tmp_path / "b" / "metrics.jsonl")
    assert a["metrics"] == b["metrics"]
    c = _run(tmp_path, "c", dropout=0.1, seed=1)
    assert c["metrics"] != a["metrics"]


def test_resume_continues_exactly(tmp_path):
    full = _run(tmp_path, "full", dropout=0.1, epochs=4)
    _run(tmp_path, "part", dropout=0.1, epochs=2)
    assert len(_lines(tmp_path / "part" / "metrics.jsonl")) == 2
    resumed = _run(tmp_path, "part", resume=True, dropout=0.1, epochs=4)
    assert _lines(tmp_path / "part" / "metrics.jsonl") == _lines(
        tmp_path / "full" / "metrics.jsonl")
    assert resumed["metrics"] == full["metrics"]
    assert resumed["epochs_run"] == 4


def test_resuming_a_finished_run_keeps_its_peak(tmp_path):
    """Nothing is left to train, so the resumed segment measures ~0 bytes; the
    summary keeps the largest peak of the run's segments (checkpointed)."""
    first = _run(tmp_path, "done", epochs=2, hidden_channels=64)
    ckpt = torch.load(tmp_path / "done" / "checkpoint.pt", weights_only=True)
    assert ckpt["peak_bytes"] == first["memory"]["peak_bytes"]
    again = _run(tmp_path, "done", resume=True, epochs=2, hidden_channels=64)
    assert again["epochs_run"] == 2
    assert again["memory"]["peak_bytes"] == first["memory"]["peak_bytes"]
    assert again["metrics"] == first["metrics"]


def test_run_directory_contents(tmp_path):
    s = _run(tmp_path, "r", epochs=2)
    run = tmp_path / "r"
    assert {p.name for p in run.iterdir()} == {"config.json", "metrics.jsonl",
                                              "checkpoint.pt", "checkpoint.prev.pt",
                                              "summary.json"}
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["num_layers"] == 2 and cfg["model"] == "res"
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(s))
    for key in ("strategy", "task", "model", "num_layers", "hidden_channels"):
        assert key in s
    assert set(s["metrics"]["test"]) >= {"pearson", "spearman", "kendall", "mae", "r2"}
    assert s["memory"]["peak_bytes"] >= 0 and s["memory"]["method"].startswith("cpu")
    assert s["memory"]["saved_for_backward_bytes"] > 0
    assert s["time"]["epoch_seconds_median"] > 0
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in recs] == [1, 2]
    assert all(0 < r["epoch_cpu_seconds"] for r in recs)
    peaks = [r["peak_bytes"] for r in recs]  # the running peak of the meter
    assert peaks == sorted(peaks) and 0 <= peaks[-1] <= s["memory"]["peak_bytes"]
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 2
    assert torch.load(run / "checkpoint.prev.pt", weights_only=True)["epoch"] == 1


class _Frozen(FullBatch):
    """Computes the loss but never produces gradients: validation cannot improve."""

    def train_step(self, model, data, loss_fn):
        with torch.no_grad():
            return float(loss_fn(self.forward(model, data), data))


def test_early_stopping_after_patience(tmp_path):
    cfg = TrainConfig(**{**TINY, "epochs": 20, "patience": 3,
                         "out": str(tmp_path / "es")})
    t = Trainer(cfg, progress=False)
    t.strategy = _Frozen()
    s = t.fit()
    assert s["early_stopped"] and s["epochs_run"] == 4  # 1 best + 3 without gain


def test_gradient_clipping_bounds_the_step(tmp_path):
    cfg = TrainConfig(**{**TINY, "epochs": 2, "clip_norm": 1e-3, "lr": 1.0,
                         "out": str(tmp_path / "clip")})
    t = Trainer(cfg, progress=False)
    norms = []

    def pre_hook(opt, *_):
        g = [p.grad.norm() for grp in opt.param_groups for p in grp["params"]
             if p.grad is not None]
        norms.append(float(torch.stack(g).norm()))

    t.optimizer.register_step_pre_hook(pre_hook)
    t.fit()
    assert norms and max(norms) <= 1e-3 * (1 + 1e-5)


def test_loss_respects_node_mask():
    loss_fn = make_loss_fn("regression")
    out = torch.tensor([[1.0], [5.0]])

    class D:
        y = torch.tensor([1.0, 0.0])

        def get(self, key, default=None):
            return torch.tensor([True, False]) if key == "node_mask" else default

    assert float(loss_fn(out, D())) == 0.0
    ce = make_loss_fn("classification")
    logits = torch.tensor([[10.0, 0.0], [0.0, 10.0]])

    class C(D):
        y = torch.tensor([0, 0])

    assert float(ce(logits, C())) < 1e-3


def test_synthetic_dataset_with_node_masks(tmp_path):
    cfg = TrainConfig(dataset="csbm:600", model="sage", num_layers=2,
                      hidden_channels=16, epochs=3, patience=0,
                      out=str(tmp_path / "csbm"))
    s = Trainer(cfg, progress=False).fit()
    assert 0.0 <= s["metrics"]["test"]["accuracy"] <= 1.0
    assert s["data"]["train"] == ["csbm-600"]


def test_bad_config_values_are_named():
    with pytest.raises(ValueError, match=r"num_layers: expected a positive integer, "
                                         r"got 0"):
        TrainConfig(num_layers=0)
    with pytest.raises(ValueError, match="strategy: expected full, reversible, "
                                         "prune, offload, distributed or auto, "
                                         "got 'magic'"):
        TrainConfig(strategy="magic")
    with pytest.raises(ValueError, match="device_budget: cannot read 'lots'"):
        TrainConfig(device_budget="lots")
    with pytest.raises(ValueError, match="test_dataset: circuits"):
        Trainer(TrainConfig(**{**TINY, "test_dataset": "iscas85/c17"}), progress=False)


def test_sparsity_reaches_res_and_gsr_models(tmp_path):
    """--sparsity/--groups configure the top-k activation of ResGNN too (the
    same blocks as GSRGNN); without sparsity ResGNN keeps plain ReLU."""
    def model(**kw):
        cfg = TrainConfig(**{**TINY, "out": str(tmp_path / "r"), **kw})
        return Trainer(cfg, progress=False).model

    res = model(num_groups=2, sparsity=3)
    assert res.k == 3 and res.blocks[0].act.group_size == 4
    assert model().k is None
    gsr = model(strategy="reversible", model="gsr", num_groups=2, sparsity=3)
    assert gsr.stack.k == 3


def test_in_memory_training_writes_nothing(tmp_path, monkeypatch):
    """record=False runs the same loop (same metrics) without any file."""
    recorded = _run(tmp_path, "rec", dropout=0.1, epochs=2)
    memory = tmp_path / "memory"
    memory.mkdir()
    monkeypatch.chdir(memory)
    cfg = TrainConfig(**{**TINY, "dropout": 0.1, "epochs": 2})
    s = Trainer(cfg, progress=False, record=False).fit()
    assert list(memory.iterdir()) == []
    assert s["run_dir"] is None and s["metrics"] == recorded["metrics"]
    assert Trainer.summary_line(s).endswith("over 2 epochs")
    with pytest.raises(ValueError, match="keeps no run directory"):
        Trainer(cfg, progress=False, record=False).fit(resume=True)


def test_fresh_run_into_old_directory_needs_force(tmp_path):
    first = _run(tmp_path, "r", epochs=2)
    with pytest.raises(RunDirError, match=r"already holds a run .*--force"):
        _run(tmp_path, "r", epochs=1)
    assert len(_lines(tmp_path / "r" / "metrics.jsonl")) == 2
    cfg = TrainConfig(**{**TINY, "epochs": 2, "out": str(tmp_path / "r")})
    again = Trainer(cfg, progress=False).fit(force=True)
    assert again["metrics"] == first["metrics"]
    assert len(_lines(tmp_path / "r" / "metrics.jsonl")) == 2


def test_given_splits_of_one_pyg_graph_train_and_score_their_masks():
    """``Trainer(splits=...)`` with one Planetoid-style graph (train/val/test
    masks, no node_mask) as every split: it trains on the training nodes and
    scores each split's own (before: on every node, test nodes included)."""
    from leangnn.graphs.synthetic import contextual_sbm

    cfg = TrainConfig(dataset="csbm:300", model="sage", num_layers=2,
                      hidden_channels=8, epochs=2)
    g = contextual_sbm(300, avg_degree=4.0, in_channels=8, seed=3)
    c = int(g.y.max()) + 1
    t = Trainer(cfg, splits=GraphSplits([g], [g], [g], "classification", c),
                progress=False, record=False)
    assert t.splits.train[0].node_mask is g.train_mask
    assert t.splits.test[0].node_mask is g.test_mask
    ref = Trainer(cfg, splits=GraphSplits([with_mask(g, g.train_mask)],
                                          [with_mask(g, g.val_mask)],
                                          [with_mask(g, g.test_mask)],
                                          "classification", c),
                  progress=False, record=False)
    assert t.fit()["metrics"] == ref.fit()["metrics"]


def test_empty_evaluation_sets_give_none(tmp_path):
    """A validation / test split without a node to score: metrics are None
    (null on disk), no early stop on a missing loss, the last model is kept."""
    cfg = TrainConfig(dataset="csbm:300", model="sage", num_layers=2,
                      hidden_channels=8, epochs=3, patience=1,
                      out=str(tmp_path / "e"))
    splits = load_graphs(cfg, progress=False)
    nobody = [with_mask(g, torch.zeros_like(g.node_mask)) for g in splits.val]
    splits = GraphSplits(splits.train, nobody, nobody, splits.task_type,
                         splits.out_channels)
    t = Trainer(cfg, splits=splits, progress=False)
    s = t.fit()
    assert s["epochs_run"] == 3 and not s["early_stopped"]
    assert set(s["metrics"]["test"]) == {"accuracy", "pearson", "spearman",
                                         "kendall", "mae", "r2", "loss"}
    assert all(v is None for v in s["metrics"]["test"].values())
    text = (tmp_path / "e" / "summary.json").read_text()
    assert "NaN" not in text and json.loads(text)["metrics"]["val"]["loss"] is None
    assert [r["val"]["loss"] for r in _lines(tmp_path / "e" / "metrics.jsonl")] == \
        [None] * 3
    assert "accuracy=n/a" in Trainer.summary_line(s)
    ckpt = torch.load(tmp_path / "e" / "checkpoint.pt", weights_only=True)
    assert ckpt["best_state"] is None  # no validation: the last model stands
    for name, v in t.model.state_dict().items():
        assert torch.equal(v, ckpt["model"][name])


def test_summary_records_the_environment(tmp_path):
    s = _run(tmp_path, "env", epochs=1)
    env = json.loads((tmp_path / "env" / "summary.json").read_text())["env"]
    assert env == s["env"]
    assert env["num_threads"] == torch.get_num_threads()
    assert env["torch"] == torch.__version__


def test_heap_trim_between_phases_changes_no_result(tmp_path, monkeypatch):
    import leangnn.train as train_mod

    calls = []
    real = train_mod.release_free_heap
    monkeypatch.setattr(train_mod, "release_free_heap",
                        lambda: calls.append(1) or real())
    kw = dict(model="gsr", num_layers=4, hidden_channels=8, num_groups=2,
              dropout=0.1, epochs=2)
    cfg = TrainConfig(**{**TINY, **kw, "out": str(tmp_path / "on")})
    on = Trainer(cfg, progress=False, trim_heap=True).fit()
    # before the setup (its resident state is measured), before the meter
    # starts, after every epoch and every validation pass, and once before
    # the test pass
    assert len(calls) == 2 + 2 * 2 + 1
    cfg = TrainConfig(**{**TINY, **kw, "out": str(tmp_path / "off")})
    off = Trainer(cfg, progress=False, trim_heap=False).fit()
    assert len(calls) == 7  # the off switch
    assert on["metrics"] == off["metrics"]
    assert _lines(tmp_path / "on" / "metrics.jsonl") == _lines(
        tmp_path / "off" / "metrics.jsonl")
    monkeypatch.setenv("LEANGNN_TRIM_HEAP", "0")
    assert not Trainer(cfg, progress=False, record=False).trim_heap
    monkeypatch.setenv("LEANGNN_TRIM_HEAP", "1")
    assert Trainer(cfg, progress=False, record=False).trim_heap


def test_non_finite_user_graph_is_refused_before_training(tmp_path):
    """A NaN feature used to train a NaN model silently (every weight NaN
    after the first step, metrics null); it is one error naming the graph,
    the tensor and how many entries are bad, and no run directory is made."""
    base = load_graphs(TrainConfig(**TINY), progress=False)
    bad = base.train[1].clone()
    bad.x[[0, 2], 1] = float("nan")
    bad.x[3, 0] = float("inf")
    splits = GraphSplits([base.train[0], bad], base.val, base.test,
                         base.task_type, base.out_channels)
    cfg = TrainConfig(**TINY, out=str(tmp_path / "run"))
    with pytest.raises(ValueError, match=rf"^train graph 1 '{bad.name}': x has 3 "
                       r"non-finite \(NaN or Inf\) entries of "
                       rf"{bad.x.numel()}, the first at \[node, feature\] \[0, 1\]"):
        Trainer(cfg, splits=splits, progress=False)
    assert not (tmp_path / "run").exists()
    label = base.test[0].clone()
    label.y[5] = float("nan")
    splits = GraphSplits(base.train, base.val, [label], base.task_type,
                         base.out_channels)
    with pytest.raises(ValueError, match=rf"^test graph 0 '{label.name}': y has 1 "
                       "non-finite"):
        Trainer(cfg, splits=splits, progress=False)


def test_a_diverged_run_stops_naming_the_epoch(tmp_path):
    """lr=1e30 turned every weight into NaN and the run finished with null
    metrics, exit 0; it stops in the epoch it diverged, before validating or
    checkpointing the NaN model, and the earlier epochs' files are kept."""
    cfg = TrainConfig(**{**TINY, "lr": 1e30, "out": str(tmp_path / "run")})
    with pytest.raises(ValueError, match=r"^training diverged in epoch 1: parameter "
                       r"'[\w.]+' is no longer finite \(train loss (nan|-?inf)\); "
                       r"lower --lr \(now 1e\+30\) or --clip-norm \(now 1\)$"):
        Trainer(cfg, progress=False).fit()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "config.json", "metrics.jsonl"]
    # without clipping (clip_norm=None) the message still names it, as 0
    cfg = TrainConfig(**{**TINY, "lr": 1e30, "clip_norm": None})
    with pytest.raises(ValueError, match=r"^training diverged in epoch 1: .* or "
                       r"--clip-norm \(now 0\)$"):
        Trainer(cfg, progress=False).fit()
    # diverging later: the last good epoch's checkpoint is kept, and named
    trainer = Trainer(TrainConfig(**{**TINY, "out": str(tmp_path / "late")}),
                      progress=False)
    step = trainer._train_epoch

    def poisoned(epoch):
        loss = step(epoch)
        if epoch == 2:
            with torch.no_grad():
                next(trainer.model.parameters()).view(-1)[0] = float("inf")
        return loss

    trainer._train_epoch = poisoned
    with pytest.raises(ValueError, match=r"^training diverged in epoch 3: .*; "
                       rf"{tmp_path / 'late'} keeps epoch 2's checkpoint$"):
        trainer.fit()
    ckpt = torch.load(tmp_path / "late" / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    # a sane run through the same check is untouched (the check reads only)
    ok = Trainer(TrainConfig(**TINY), progress=False, record=False).fit()
    assert ok["epochs_run"] == TINY["epochs"]
    assert all(torch.isfinite(torch.tensor(v)) for v in ok["metrics"]["test"].values())
