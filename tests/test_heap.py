"""The compact glibc heap: its environment, the command's re-execution, and a
run in it against one in glibc's default heap (the saving and the sameness)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from leangnn import heap
from leangnn.heap import (
    COMPACT_TUNABLES,
    MKL_ENV,
    compact_heap_env,
    default_heap_env,
    ensure_compact_heap,
    heap_env,
    heap_mode,
    mkl_buffer_bytes,
    mkl_buffers_cached,
    mmap_threshold,
)


def test_modes_follow_the_environment():
    assert heap_mode({}) == "default"
    assert heap_mode(compact_heap_env({})) == "compact"
    assert heap_mode({"MALLOC_MMAP_THRESHOLD_": "65536"}) == "mmap"
    # a tcache of the user's own size is not the compact heap
    assert heap_mode({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=3"}) == "default"


def test_compact_env_keeps_the_users_tunables():
    env = compact_heap_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:"
                            "glibc.malloc.trim_threshold=1024",
                            "MALLOC_MMAP_THRESHOLD_": "65536", "HOME": "/x"})
    tun = env["GLIBC_TUNABLES"].split(":")
    assert "glibc.malloc.arena_max=2" in tun
    # the user's own trim threshold wins over ours
    assert "glibc.malloc.trim_threshold=1024" in tun
    assert COMPACT_TUNABLES[2] not in tun
    assert COMPACT_TUNABLES[0] in tun and COMPACT_TUNABLES[1] in tun
    assert "MALLOC_MMAP_THRESHOLD_" not in env and env["HOME"] == "/x"
    # and back: only ours go
    back = default_heap_env(env)
    assert back["GLIBC_TUNABLES"].split(":") == ["glibc.malloc.arena_max=2",
                                                 "glibc.malloc.trim_threshold=1024"]
    assert "GLIBC_TUNABLES" not in default_heap_env(compact_heap_env({}))


def test_compact_env_turns_off_mkls_thread_buffers_unless_the_user_chose():
    assert compact_heap_env({})["MKL_DISABLE_FAST_MM"] == "1"
    assert compact_heap_env({"MKL_DISABLE_FAST_MM": "yes"})["MKL_DISABLE_FAST_MM"] \
        == "yes"
    assert "MKL_DISABLE_FAST_MM" not in default_heap_env(compact_heap_env({}))
    assert default_heap_env({"MKL_DISABLE_FAST_MM": "yes"})["MKL_DISABLE_FAST_MM"] \
        == "yes"
    assert not mkl_buffers_cached(compact_heap_env({}))
    assert mkl_buffers_cached({}) == torch.backends.mkl.is_available()
    # (MKL reads any non-empty value as off)
    assert mkl_buffers_cached({"MKL_DISABLE_FAST_MM": ""}) == \
        torch.backends.mkl.is_available()


def test_a_child_of_each_heap():
    user = {"LEANGNN_HEAP": "default", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    for mode in ("compact", "default", "mmap"):
        env = heap_env(mode, user)
        assert heap_mode(env) == mode
        assert "glibc.malloc.arena_max=2" in env["GLIBC_TUNABLES"]
        # the command re-executes itself into the compact heap unless told not to
        assert env.get("LEANGNN_HEAP") == (None if mode == "compact" else "default")
    with pytest.raises(ValueError, match="heap mode: expected one of"):
        heap_env("tiny")


def test_fixed_mmap_threshold():
    assert mmap_threshold({}) is None
    assert mmap_threshold({"MALLOC_MMAP_THRESHOLD_": "65536"}) == 65536
    assert mmap_threshold(compact_heap_env({})) == 32 << 20
    assert mmap_threshold({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=x"}) is None


@pytest.fixture
def execs(monkeypatch):
    """``os.execve`` recorded instead of run, on a Linux glibc process."""
    calls = []
    monkeypatch.setattr(os, "execve", lambda *a: calls.append(a))
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(heap, "_glibc", lambda: True)
    for k in ("LEANGNN_HEAP", "LEANGNN_HEAP_REEXEC", "MALLOC_MMAP_THRESHOLD_",
              "GLIBC_TUNABLES"):
        monkeypatch.delenv(k, raising=False)
    return calls


def test_the_command_reexecutes_itself_once(execs, monkeypatch):
    ensure_compact_heap()
    (path, argv, env), = execs
    assert path == sys.executable and argv == sys.orig_argv
    assert heap_mode(env) == "compact" and env["LEANGNN_HEAP_REEXEC"] == "1"
    # the re-executed process does not do it again
    monkeypatch.setenv("LEANGNN_HEAP_REEXEC", "1")
    monkeypatch.setenv("GLIBC_TUNABLES", env["GLIBC_TUNABLES"])
    ensure_compact_heap()
    assert len(execs) == 1


@pytest.mark.parametrize("var,value", [
    ("LEANGNN_HEAP", "default"), ("LEANGNN_HEAP", " Default "),
    ("MALLOC_MMAP_THRESHOLD_", "65536"),
    ("GLIBC_TUNABLES", "glibc.malloc.tcache_count=7")])
def test_the_users_choice_is_left_alone(execs, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    ensure_compact_heap()
    assert execs == []


def test_an_unknown_setting_is_one_error_line(execs, monkeypatch, capsys):
    monkeypatch.setenv("LEANGNN_HEAP", "tiny")
    with pytest.raises(SystemExit) as e:
        ensure_compact_heap()
    assert e.value.code == 2 and execs == []
    err = capsys.readouterr().err.strip()
    assert err == ("leangnn: error: LEANGNN_HEAP must be compact or default, "
                   "got 'tiny'")


def test_nothing_to_do_off_linux(execs, monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    ensure_compact_heap()
    assert execs == []


def test_a_failed_exec_goes_on(monkeypatch):
    def fail(*a):
        raise OSError("exec format error")
    monkeypatch.setattr(os, "execve", fail)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(heap, "_glibc", lambda: True)
    monkeypatch.delenv("LEANGNN_HEAP", raising=False)
    monkeypatch.delenv("LEANGNN_HEAP_REEXEC", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    ensure_compact_heap()  # no exception: the command runs in the heap it has


def _train(tmp_path, name: str, heap_setting: str) -> tuple[dict, list[dict]]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_",
                        "LEANGNN_HEAP_REEXEC")}
    env.update(LEANGNN_HEAP=heap_setting, OMP_NUM_THREADS="1")
    out = tmp_path / name
    subprocess.run([sys.executable, "-m", "leangnn", "train", "--dataset",
                    "csbm:4000", "--strategy", "full", "--model", "res", "--conv",
                    "gcn", "--layers", "8", "--hidden", "32", "--epochs", "2",
                    "--out", str(out), "--quiet"], env=env, check=True,
                   capture_output=True, timeout=600)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().split("\n")
               if x.strip()]
    return json.loads((out / "summary.json").read_text()), records


@pytest.mark.skipif(not sys.platform.startswith("linux") or not heap._glibc(),
                    reason="the compact heap is glibc's (Linux)")
def test_compact_heap_trains_the_same_model_in_less_memory(tmp_path):
    # a residual GCN stack on a graph of degree 25: each layer frees E x C
    # messages whose holes the default heap's cached small chunks split
    compact, rec_c = _train(tmp_path, "compact", "compact")
    default, rec_d = _train(tmp_path, "default", "default")
    assert compact["env"]["heap"] == "compact"
    assert default["env"]["heap"] == "default"
    # the same computation: the allocator decides only where blocks live
    assert [r["train_loss"] for r in rec_c] == [r["train_loss"] for r in rec_d]
    assert compact["metrics"] == default["metrics"]
    # measured: 64 MiB against 178 MiB (3 processes each)
    assert compact["memory"]["peak_bytes"] < 0.6 * default["memory"]["peak_bytes"]


_STEP = """
import json, torch
from leangnn.heap import mkl_buffer_bytes
torch.manual_seed(0)
torch.set_num_threads(2)
x = torch.randn(20000, 128)
lin = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(),
                          torch.nn.Linear(128, 64))
loss = lin(x).square().mean()
loss.backward()
print(json.dumps({"held": mkl_buffer_bytes(), "loss": loss.item(),
                  "grad": [p.grad.double().sum().item() for p in lin.parameters()]}))
"""


def _step(mkl_off: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in MKL_ENV}
    env.pop("OMP_NUM_THREADS", None)
    if mkl_off:
        env.update(MKL_ENV)
    p = subprocess.run([sys.executable, "-c", _STEP], env=env, check=True,
                       capture_output=True, text=True, timeout=300)
    return json.loads(p.stdout)


@pytest.mark.skipif(mkl_buffer_bytes() is None, reason="torch built without MKL")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="MKL runs one thread on one core")
def test_mkls_thread_buffers_off_hold_nothing_and_compute_the_same():
    # two threads: each MKL worker keeps the buffers of its share of the
    # products; with MKL_ENV none (the compact heap's environment)
    cached, off = _step(False), _step(True)
    assert cached["held"] > 1 << 20 and off["held"] == 0
    # where buffers live decides nothing of the values
    assert cached["loss"] == off["loss"] and cached["grad"] == off["grad"]


def test_heap_threshold_is_the_fixed_one_else_glibcs_ceiling_and_none_on_cuda(
        monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert heap.heap_threshold("cpu", {}) == 32 << 20
    assert heap.heap_threshold("cpu", compact_heap_env({})) == 32 << 20
    assert heap.heap_threshold("cpu", {"MALLOC_MMAP_THRESHOLD_": "65536"}) == 65536
    assert heap.heap_threshold("cuda", {"MALLOC_MMAP_THRESHOLD_": "65536"}) == 0
    monkeypatch.setattr(sys, "platform", "darwin")
    assert heap.heap_threshold("cpu", {}) == 0
