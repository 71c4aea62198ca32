"""RunDir: lock, refusal to overwrite, stale temporary files, checkpoint
rotation and safe loading; crash tests (SIGKILL during training and inside a
checkpoint write, then ``--resume``) and damaged / planted checkpoints, each
checked against an uninterrupted run of the same configuration."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from leangnn.cli import main
from leangnn.config import TrainConfig
from leangnn.data import load_graphs
from leangnn.rundir import CheckpointError, RunDir, RunDirError, UnsafeCheckpointError
from leangnn.train import Trainer

ARGS = ["train", "--dataset", "iscas85/c17,misc/mux_4,epfl/ctrl,misc/c17_gates",
        "--val-dataset", "misc/mux_2", "--test-dataset", "misc/switch",
        "--model", "res", "--layers", "2", "--hidden", "8", "--dropout", "0.1",
        "--patience", "0", "--quiet"]
STEPS_PER_EPOCH = 4  # one optimizer step per training circuit


def _train(out, epochs, *extra):
    return main([*ARGS, "--epochs", str(epochs), "--out", str(out), *extra])


def _resume(out, epochs=4):
    return main(["train", "--out", str(out), "--resume", "--epochs", str(epochs),
                 "--quiet"])


def _lines(run):
    """metrics.jsonl without the wall times (strict JSON: no NaN tokens)."""
    out = []
    for ln in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(ln, parse_constant=lambda c: pytest.fail(f"token {c}"))
        rec.pop("epoch_seconds")
        rec.pop("epoch_cpu_seconds")
        rec.pop("peak_bytes")  # memory: not deterministic
        out.append(rec)
    return out


def _metrics(run):
    return json.loads((run / "summary.json").read_text())["metrics"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 4-epoch run and a 3-epoch run to damage."""
    root = tmp_path_factory.mktemp("reference")
    assert _train(root / "full", 4) == 0
    assert _train(root / "three", 3) == 0
    assert _train(root / "wide", 1, "--hidden", "16") == 0
    return root


# ----------------------------------------------------------------- lock
def test_second_open_is_refused_naming_dir_and_pid(tmp_path):
    first = RunDir(tmp_path / "r").open()
    with pytest.raises(RunDirError, match=rf"{tmp_path / 'r'} is in use by another "
                                          rf"leangnn run \(pid {os.getpid()}\)"):
        RunDir(tmp_path / "r").open(resume=True)
    first.close()
    assert not (tmp_path / "r" / ".lock").exists()
    with RunDir(tmp_path / "r").open(resume=True) as again:
        assert (again.path / ".lock").read_text().strip() == str(os.getpid())


def test_a_directory_that_cannot_be_created_is_named(tmp_path):
    """mkdir's bare OSError ('[Errno 2] No such file or directory') did not say
    it was the run directory; root passes the CLI's early access check on
    /proc and /sys, so the error surfaced from here."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    targets = [blocker / "run"] + ([os.path.join("/proc", "leangnn-run")]
                                   if os.path.isdir("/proc/self") else [])
    for target in targets:
        with pytest.raises(RunDirError, match=rf"^out: cannot create the run "
                           rf"directory '{target}' \(.+\)$"):
            RunDir(target).open()
    assert blocker.read_text() == "x"


def test_lock_held_by_another_process(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from leangnn.rundir import RunDir
            run = RunDir({str(tmp_path)!r}).open()
            print("locked", flush=True)
            sys.stdin.read()
            run.close()
            """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match=rf"\(pid {holder.pid}\)"):
            RunDir(tmp_path).open(resume=True)
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0
    RunDir(tmp_path).open(resume=True).close()


def test_two_trainings_on_one_out(tmp_path):
    """The second run gets a one-line error and metrics.jsonl stays whole."""
    holder = RunDir(tmp_path / "busy").open()
    try:
        assert _train(tmp_path / "busy", 1) == 2
    finally:
        holder.close()
    assert (tmp_path / "busy" / "metrics.jsonl").read_text() == ""


# ----------------------------------------------------------- fresh vs old
def test_fresh_run_refuses_old_directory_unless_forced(tmp_path, capsys):
    assert _train(tmp_path / "r", 2) == 0
    before = (tmp_path / "r" / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert _train(tmp_path / "r", 1) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(tmp_path / "r") in err and "--force" in err
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == before
    (tmp_path / "r" / "config.json").unlink()  # any file of a run is enough
    with pytest.raises(RunDirError, match=r"r already holds a run \(metrics.jsonl, "
                                          r"checkpoint.pt, checkpoint.prev.pt, "
                                          r"summary.json\); .*--force"):
        RunDir(tmp_path / "r").open()
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == before
    run = RunDir(tmp_path / "r").open(force=True)
    run.close()
    assert {p.name for p in (tmp_path / "r").iterdir()} == {"metrics.jsonl"}
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == ""
    # an existing directory without a run is fine (e.g. a fresh tmp folder)
    (tmp_path / "empty").mkdir()
    RunDir(tmp_path / "empty").open().close()


@pytest.mark.parametrize("name,content", [
    ("config.json", '{"model_name": "bert", "lr": 0.1}\n'),
    ("summary.json", '{"accuracy": 0.9}\n'),
    ("metrics.jsonl", '{"step": 1, "loss": 0.5}\n'),
    ("plan.json", "[1, 2]\n"),
    ("checkpoint.pt", None),
])
def test_force_never_deletes_files_another_program_wrote(tmp_path, capsys, name,
                                                        content):
    """--force replaces a leangnn run; a user's own config.json (or a PyTorch
    checkpoint.pt of theirs) in the --out folder is refused by name and kept."""
    out = tmp_path / "project"
    out.mkdir()
    path = out / name
    if content is None:
        torch.save({"weights": torch.ones(3), "epoch": 7}, path)
    else:
        path.write_text(content)
    before = path.read_bytes()
    with pytest.raises(RunDirError, match=rf"{name} was not written by a leangnn "
                                          r"run .*choose another --out"):
        RunDir(out).open(force=True)
    assert path.read_bytes() == before
    capsys.readouterr()
    assert _train(out, 1, "--force") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and name in err and "leangnn run" in err
    assert path.read_bytes() == before
    # a leangnn run in the same place is replaced as before
    assert _train(tmp_path / "run", 1) == 0
    assert _train(tmp_path / "run", 1, "--force") == 0


def test_stale_temporary_files_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    stale = run_dir / f".checkpoint.pt.{pid}.tmp"
    live = run_dir / f".summary.json.{os.getpid()}.tmp"
    stale.write_bytes(b"half")
    live.write_bytes(b"mine")
    RunDir(run_dir).open().close()
    assert not stale.exists() and live.exists()


# --------------------------------------------------------------- files
def test_metrics_and_summary_are_standard_json(tmp_path):
    with RunDir(tmp_path).open() as run:
        run.append_metrics({"epoch": 1, "train_loss": float("nan"),
                            "val": {"loss": float("inf"), "pearson": 0.5}})
        run.append_metrics({"epoch": 2, "train_loss": 1.0, "val": {}})
        with open(tmp_path / "metrics.jsonl", "a") as f:
            f.write('{"epoch": 3, "train_lo')  # a line cut short by a crash
        assert [r["epoch"] for r in run.read_metrics()] == [1, 2]
        run.truncate_metrics(1)
        run.write_summary({"metrics": {"test": {"r2": float("-inf")}}})
    text = (tmp_path / "metrics.jsonl").read_text()
    assert text == '{"epoch": 1, "train_loss": null, "val": {"loss": null, ' \
                   '"pearson": 0.5}}\n'
    summary = (tmp_path / "summary.json").read_text()
    assert "Infinity" not in summary
    assert json.loads(summary) == {"metrics": {"test": {"r2": None}}}


def test_disabled_rundir_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with RunDir(None).open() as run:
        run.write_config({"a": 1})
        run.append_metrics({"epoch": 1})
        run.save_checkpoint({"epoch": 1})
        run.write_summary({})
        with pytest.raises(ValueError, match="no run directory"):
            run.load_checkpoint()
    assert list(tmp_path.iterdir()) == []


def _state(epoch, **over):
    state = {"epoch": epoch, "best": 1.0, "best_state": None, "bad_epochs": 0,
             "epoch_times": [0.1] * epoch, "model": {"w": torch.full((2,), epoch)},
             "optimizer": {"state": {}, "param_groups": []}, "strategy": {},
             "rng": {}, "config": {}}
    state.update(over)
    return state


def test_checkpoint_rotation_keeps_the_previous_one(tmp_path):
    with RunDir(tmp_path).open() as run:
        run.save_checkpoint(_state(1))
        assert not (tmp_path / "checkpoint.prev.pt").exists()
        run.save_checkpoint(_state(2))
        run.save_checkpoint(_state(3))
        assert run.load_checkpoint()["epoch"] == 3
    prev = torch.load(tmp_path / "checkpoint.prev.pt", weights_only=True)
    assert prev["epoch"] == 2 and prev["model"]["w"].tolist() == [2, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.prev.pt", "checkpoint.pt", "metrics.jsonl"]


def test_a_read_only_fall_back_leaves_the_files_alone(tmp_path):
    """A rank that does not write the run (``read_only``) resumes from the
    previous checkpoint when the last is damaged, and moves no file: the
    writing rank reinstates it."""
    with RunDir(tmp_path).open() as run:
        run.save_checkpoint(_state(1))
        run.save_checkpoint(_state(2))
    (tmp_path / "checkpoint.pt").write_bytes(b"torn")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.warns(RuntimeWarning, match="resuming from .*checkpoint.prev.pt"):
        state = RunDir(tmp_path).load_checkpoint(read_only=True)
    assert state["epoch"] == 1
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    with pytest.warns(RuntimeWarning, match="damaged file is kept"):
        assert RunDir(tmp_path).load_checkpoint()["epoch"] == 1
    assert (tmp_path / "checkpoint.pt").read_bytes() != b"torn"


def test_a_missing_checkpoint_is_named(tmp_path):
    assert _train(tmp_path / "r", 1) == 0
    (tmp_path / "r" / "checkpoint.pt").unlink()
    with RunDir(tmp_path / "r").open(resume=True) as run, pytest.raises(
            FileNotFoundError, match="no checkpoint in .*checkpoint.pt"):
        run.load_checkpoint()


# ------------------------------------------------------------ crash tests
CRASH = textwrap.dedent("""
    import os, signal, sys
    import torch
    torch.set_num_threads(int(sys.argv[1]))
    from leangnn import rundir, strategy
    from leangnn.cli import main

    point, nth, cut = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    calls = [0]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "train-step":
        step = strategy.FullBatch.train_step

        def killing_step(self, *args, **kwargs):
            calls[0] += 1
            if calls[0] == nth:
                die()
            return step(self, *args, **kwargs)

        strategy.FullBatch.train_step = killing_step
    else:
        def hook(where, tmp):
            if where == point:
                calls[0] += 1
                if calls[0] == nth:
                    if cut == "half":  # as if killed after half the bytes
                        os.truncate(tmp, os.path.getsize(tmp) // 2)
                    die()

        rundir.crash_hook = hook
    sys.exit(main(sys.argv[5:]))
""")


@pytest.mark.parametrize("point,nth,cut,epochs_kept", [
    ("train-step", STEPS_PER_EPOCH + 2, "-", 1),    # in the middle of epoch 2
    ("checkpoint-written", 2, "half", 1),           # epoch 2's checkpoint half written
    pytest.param("checkpoint-rotated", 3, "-", 2,   # epoch 3's, old one rotated
                 marks=pytest.mark.slow),
])
def test_sigkill_then_resume_gives_the_uninterrupted_metrics(
        tmp_path, reference, point, nth, cut, epochs_kept):
    out = tmp_path / "killed"
    args = [*ARGS, "--epochs", "4", "--out", str(out)]
    proc = subprocess.run([sys.executable, "-c", CRASH, str(torch.get_num_threads()),
                           point, str(nth), cut, *args], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    # the kill happened where intended
    kept = torch.load(out / "checkpoint.pt", weights_only=True)
    assert kept["epoch"] == epochs_kept
    tmp = list(out.glob(".checkpoint.pt.*.tmp"))
    assert len(tmp) == (0 if point == "train-step" else 1)
    assert (out / ".lock").exists()  # the killed holder never released it

    assert _resume(out) == 0
    assert not list(out.glob(".*.tmp")) and not (out / ".lock").exists()
    assert _lines(out) == _lines(reference / "full")
    assert _metrics(out) == _metrics(reference / "full")


def test_sigkill_before_the_first_checkpoint_then_resume(tmp_path, reference,
                                                         capsys):
    """Killed in epoch 1, a run has config.json and no checkpoint: --resume
    said only 'no checkpoint' and a plain rerun 'already holds a run'; the
    resume error now says that --force starts it over, which gives the
    uninterrupted run."""
    out = tmp_path / "killed"
    args = [*ARGS, "--epochs", "4", "--out", str(out)]
    proc = subprocess.run([sys.executable, "-c", CRASH, str(torch.get_num_threads()),
                           "train-step", "2", "-", *args], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert (out / "config.json").is_file() and not list(out.glob("checkpoint*"))
    capsys.readouterr()
    assert _resume(out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"leangnn: error: resume: no checkpoint in {out} (checkpoint.pt "
                   "is missing); --force starts the run over"]
    assert _train(out, 4, "--force") == 0
    assert _lines(out) == _lines(reference / "full")
    assert _metrics(out) == _metrics(reference / "full")


# ------------------------------------------------------ damaged checkpoints
class _Planted:
    """Unpickling this runs code: it would create the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def _damage(kind, path, reference, marker):
    good = torch.load(path, weights_only=True)
    if kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "zero-bytes":
        path.write_bytes(b"")
    elif kind == "random-bytes":
        path.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8,
                                       generator=torch.Generator().manual_seed(0))
                         .numpy().tobytes())
    elif kind == "missing-key":
        del good["optimizer"]
        torch.save(good, path)
    elif kind == "wrong-types":
        good["epoch"] = "3"
        good["model"] = [1, 2, 3]
        torch.save(good, path)
    elif kind == "other-config":
        shutil.copyfile(reference / "wide" / "checkpoint.pt", path)
    elif kind == "other-shape":  # same config entries, weights of a wider model
        good["model"] = torch.load(reference / "wide" / "checkpoint.pt",
                                   weights_only=True)["model"]
        torch.save(good, path)
    elif kind == "planted-code":
        good["model"] = _Planted(marker)
        torch.save(good, path)
    elif kind == "planted-raw-pickle":
        import pickle

        path.write_bytes(pickle.dumps({"model": _Planted(marker)}))
    else:
        raise AssertionError(kind)


DAMAGE = ["truncated", "zero-bytes", "random-bytes", "missing-key", "wrong-types",
          "other-config", "other-shape", "planted-code", "planted-raw-pickle"]


@pytest.fixture(scope="module")
def splits(reference):
    """The reference run's graphs, loaded once (resuming then skips loading)."""
    return load_graphs(TrainConfig.load(reference / "three" / "config.json"),
                       progress=False)


def _resume_in_process(out, splits, epochs=4):
    cfg = TrainConfig.load(out / "config.json")
    cfg.epochs, cfg.out = epochs, str(out)
    return Trainer(cfg, splits=splits, progress=False).fit(resume=True)


_RAW_PICKLE = "ignore:Detected pickle protocol:UserWarning"


@pytest.mark.filterwarnings(_RAW_PICKLE)
@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path, reference,
                                                           splits, kind):
    out, marker = tmp_path / "run", tmp_path / "marker"
    shutil.copytree(reference / "three", out)
    _damage(kind, out / "checkpoint.pt", reference, marker)
    if kind == "planted-code":  # refused outright, even with a good previous one
        refused = r"checkpoint.pt: refused: it holds (builtins\.)?exec,"
        with pytest.raises(UnsafeCheckpointError, match=refused):
            _resume_in_process(out, splits)
        assert not marker.exists()
        return
    with pytest.warns(RuntimeWarning, match=r"checkpoint.pt: .*; resuming from "
                                            r".*checkpoint.prev.pt \(epoch 2\)"):
        summary = _resume_in_process(out, splits)
    assert not marker.exists()
    assert _lines(out) == _lines(reference / "full")
    assert summary["metrics"] == _metrics(reference / "full") == _metrics(out)
    # the damaged file was set aside, so the next rotation kept a good one
    assert (out / "checkpoint.pt.damaged").exists()
    assert torch.load(out / "checkpoint.prev.pt", weights_only=True)["epoch"] == 3


@pytest.mark.filterwarnings(_RAW_PICKLE)
@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_checkpoint_without_previous_is_one_line_error(
        tmp_path, reference, splits, kind, capsys):
    out, marker = tmp_path / "run", tmp_path / "marker"
    shutil.copytree(reference / "three", out)
    (out / "checkpoint.prev.pt").unlink()
    _damage(kind, out / "checkpoint.pt", reference, marker)
    with pytest.raises(CheckpointError) as info:
        _resume_in_process(out, splits)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"{out / 'checkpoint.pt'}: ")
    assert not marker.exists()
    if kind in ("truncated", "other-shape", "planted-code"):  # and through the CLI
        capsys.readouterr()
        assert _resume(out) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"leangnn: error: {out / 'checkpoint.pt'}: ")
        assert not marker.exists()


def test_checkpoints_load_without_executing_code(tmp_path):
    """weights_only loading: a planted checkpoint never runs, even when read
    directly, and a legitimate one holds only tensors and plain data."""
    marker = tmp_path / "marker"
    torch.save({"format": RunDir.FORMAT, "x": _Planted(marker)}, tmp_path / "c.pt")
    with pytest.raises(UnsafeCheckpointError, match=r"c\.pt: refused"):
        RunDir(tmp_path).read_checkpoint(tmp_path / "c.pt")
    assert not marker.exists()
