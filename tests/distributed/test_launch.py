"""Launchers: torchrun's environment, and a dead rank ends the job with an
error naming it (never a hang: every job here also runs under a deadline, so
a regression fails with "timed out" instead of blocking the suite)."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from leangnn.distributed import (
    DistributedError,
    GraphParallel,
    init_distributed,
    launch_processes,
    rank_threads,
    relaunch_cli,
    spawn,
)
from leangnn.distributed import launch as launch_mod


def _dies(ctx):
    if ctx.rank == 1:
        os._exit(3)
    t = torch.ones(1)
    dist.all_reduce(t)  # its peer never arrives
    return float(t)


def _raises(ctx):
    if ctx.rank == 1:
        raise ValueError("rank one cannot go on")
    dist.barrier()


def test_spawn_dead_rank_is_an_error_naming_it():
    with pytest.raises(DistributedError, match=r"rank 1 of 2 exited with status 3"):
        spawn(_dies, 2, start_method="fork", timeout=60, join_timeout=120)


def test_spawn_exception_in_a_rank_is_reported():
    with pytest.raises(DistributedError, match="rank 1 of 2 raised: .*rank one"):
        spawn(_raises, 2, start_method="fork", timeout=60, join_timeout=120)


_KILLED = textwrap.dedent("""
    import os, signal, sys, torch, torch.distributed as dist
    from leangnn.distributed.runtime import init_distributed
    ctx = init_distributed(timeout=60)
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(1)
    dist.all_reduce(t)
    open(sys.argv[1], "w").write("rank 0 finished")
""")


_HANGS = textwrap.dedent("""
    import os, signal, sys, time
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # stands for a collective waiting on the dead peer
    open(sys.argv[1], "w").write("rank 0 finished")
""")


def test_launch_killed_rank_stops_a_waiting_peer(tmp_path):
    marker = tmp_path / "finished"
    with pytest.raises(DistributedError,
                       match=r"rank 1 of 2 was killed by signal SIGKILL"):
        launch_processes([sys.executable, "-c", _HANGS, str(marker)], 2,
                         timeout=50, grace=2)
    assert not marker.exists()


@pytest.mark.slow  # two fresh interpreters importing torch
def test_launch_killed_gloo_rank_stops_the_others(tmp_path):
    marker = tmp_path / "finished"
    with pytest.raises(DistributedError,
                       match=r"rank 1 of 2 was killed by signal SIGKILL"):
        launch_processes([sys.executable, "-c", _KILLED, str(marker)], 2,
                         timeout=120, grace=2)
    assert not marker.exists()


def test_launch_sets_torchrun_environment(tmp_path):
    code = ("import json, os, sys; keys = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', "
            "'MASTER_ADDR', 'MASTER_PORT']; open(os.path.join(sys.argv[1], "
            "os.environ['RANK'] + '.json'), 'w').write(json.dumps({k: os.environ[k] "
            "for k in keys} | {'argv': sys.argv[2:]}))")
    rc = launch_processes([sys.executable, "-c", code, str(tmp_path)], 3,
                          timeout=60, rank_args=lambda r: [f"r{r}"])
    assert rc == 0
    envs = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(3)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    assert int(envs[0]["MASTER_PORT"]) > 0
    assert [e["argv"] for e in envs] == [["r0"], ["r1"], ["r2"]]


def test_launch_shares_cores_unless_threads_are_set(tmp_path, monkeypatch):
    code = ("import os, sys; open(os.path.join(sys.argv[1], os.environ['RANK']), "
            "'w').write(os.environ['OMP_NUM_THREADS'])")
    cmd = [sys.executable, "-c", code, str(tmp_path)]
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(7)),
                        raising=False)
    assert rank_threads(2) == 3 and rank_threads(16) == 1
    assert launch_processes(cmd, 2, timeout=60) == 0
    assert {(tmp_path / r).read_text() for r in "01"} == {"3"}
    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # the user's choice wins
    assert launch_processes(cmd, 2, timeout=60) == 0
    assert {(tmp_path / r).read_text() for r in "01"} == {"5"}


def test_launch_timeout_stops_all(tmp_path):
    with pytest.raises(DistributedError, match="timed out after 1 s"):
        launch_processes([sys.executable, "-c", "import time; time.sleep(60)"], 2,
                         timeout=1, grace=1)


def test_relaunch_cli_rewrites_the_command(monkeypatch):
    seen = {}

    def fake(cmd, nproc, rank_args=None, **kw):
        seen.update(cmd=cmd, nproc=nproc, extra=[rank_args(r) for r in range(nproc)])
        return 0

    monkeypatch.setattr(launch_mod, "launch_processes", fake)
    assert relaunch_cli(["train", "--nproc", "2", "--epochs", "3",
                         "--strategy=distributed"], 2) == 0
    assert seen["cmd"] == [sys.executable, "-m", "leangnn", "train", "--epochs", "3",
                           "--strategy", "distributed"]
    assert seen["nproc"] == 2 and seen["extra"] == [[], ["--quiet"]]
    with pytest.raises(ValueError, match="--strategy full"):
        relaunch_cli(["train", "--nproc=2", "--strategy", "full"], 2)
    with pytest.raises(ValueError, match="--strategy auto"):
        relaunch_cli(["train", "--nproc=2", "--strategy", "auto"], 2)
    # the planner's pick replaces --strategy auto and the budget
    assert relaunch_cli(["train", "--nproc", "2", "--strategy", "auto",
                         "--memory-budget", "1GiB", "--memory-budget=2GiB",
                         "--epochs", "3"], 2, planned=["--dist-mode", "graph"],
                        env={"X": "1"}) == 0
    assert seen["cmd"] == [sys.executable, "-m", "leangnn", "train", "--epochs", "3",
                           "--strategy", "distributed", "--dist-mode", "graph"]


def test_init_without_launch_environment_says_how(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    assert not dist.is_initialized()
    with pytest.raises(DistributedError, match=r"RANK.*torchrun --nproc-per-node"):
        init_distributed()
    monkeypatch.setenv("RANK", "zero")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(DistributedError, match=r"RANK='zero' is not an integer"):
        init_distributed()


def _nccl_graph_parallel(ctx, data):
    from torch_geometric.nn.models import GCN

    torch.manual_seed(0)
    model = GCN(data.num_features, 8, 2, 2).to(ctx.device)
    runner = GraphParallel(data, device=ctx.device)
    loss, _ = runner.train_step(
        model, data, lambda out, d: torch.nn.functional.cross_entropy(
            out, d.y.to(out.device)))
    return loss, {k: v.grad.cpu() for k, v in model.named_parameters()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available: "
                    "the NCCL path needs a GPU per rank")
def test_nccl_graph_parallel_equals_full_batch():
    from torch_geometric.nn.models import GCN

    from leangnn.graphs.synthetic import contextual_sbm

    data = contextual_sbm(200, num_classes=2, avg_degree=5, in_channels=4, seed=0)
    nproc = min(2, torch.cuda.device_count())
    res = spawn(_nccl_graph_parallel, nproc, args=(data,), backend="nccl",
                timeout=120, join_timeout=300)
    torch.manual_seed(0)
    model = GCN(data.num_features, 8, 2, 2)
    loss = torch.nn.functional.cross_entropy(model(data.x, data.edge_index), data.y)
    loss.backward()
    for got_loss, grads in res:
        assert got_loss == pytest.approx(float(loss), rel=1e-5)
        for k, v in model.named_parameters():
            torch.testing.assert_close(grads[k], v.grad, rtol=1e-5, atol=1e-6)


def test_signal_names_are_readable():
    assert launch_mod._describe(-signal.SIGKILL) == "was killed by signal SIGKILL"
    assert launch_mod._describe(2) == "exited with status 2"


_RANK_OF_A_KILLED_LAUNCHER = textwrap.dedent("""
    import os, sys, time
    from leangnn.distributed.launch import die_with_launcher
    die_with_launcher()
    open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").write(str(os.getpid()))
    time.sleep(60)  # a rank still training when its launcher is killed
""")

_LAUNCHER = textwrap.dedent("""
    import sys
    from leangnn.distributed.launch import launch_processes
    launch_processes([sys.executable, "-c", sys.argv[1], sys.argv[2]], 2)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _assert_ranks_die_with(argv: list[str], folder, who: str) -> None:
    """Start ``argv`` (a process whose two ranks write their pids into
    ``folder``), SIGKILL it once both run, and check that both end."""
    import subprocess

    parent = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                (folder / r).is_file() and (folder / r).read_text()
                for r in ("0", "1")):
            time.sleep(0.05)
        pids = [int((folder / r).read_text() or 0) for r in ("0", "1")]
        assert all(_alive(p) for p in pids)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if _alive(p)]
    for p in left:  # do not leave them behind when the check fails
        os.kill(p, signal.SIGKILL)
    assert left == [], f"ranks {left} outlived their SIGKILLed {who}"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")
def test_ranks_die_with_a_killed_launcher(tmp_path):
    _assert_ranks_die_with([sys.executable, "-c", _LAUNCHER,
                            _RANK_OF_A_KILLED_LAUNCHER, str(tmp_path)], tmp_path,
                           "launcher")


def _parked(ctx, folder):
    # both ranks blocked inside gloo, each waiting for the other: Python's
    # SIGINT (torch's death signal for spawned children) is not seen there
    with open(os.path.join(folder, str(ctx.rank)), "w") as f:
        f.write(str(os.getpid()))
    dist.recv(torch.zeros(1), src=1 - ctx.rank)


_SPAWNER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from test_launch import _parked
    from leangnn.distributed.launch import spawn
    spawn(_parked, 2, args=(sys.argv[1],))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")
def test_spawned_ranks_die_with_a_killed_caller(tmp_path):
    # `python -m leangnn.plan.calibrate --collectives P` killed half-way left
    # its ranks parked in a barrier until the process group's timeout
    _assert_ranks_die_with([sys.executable, "-c", _SPAWNER, str(tmp_path),
                            os.path.dirname(__file__)], tmp_path, "caller")


def test_local_ranks_beyond_this_machine_are_refused_before_any_starts(
        monkeypatch, tmp_path):
    monkeypatch.delenv(launch_mod.MAX_RANKS_ENV, raising=False)
    cores = rank_threads(1)
    most = launch_mod.MAX_RANKS_PER_CORE * cores
    launch_mod.check_local_ranks(most)  # the limit itself starts
    started = []
    monkeypatch.setattr(launch_mod.subprocess, "Popen",
                        lambda *a, **k: started.append(a) or None)
    with pytest.raises(ValueError, match=rf"--nproc {most + 1}: .*{cores} usable"):
        launch_processes([sys.executable, "-c", "pass"], most + 1)
    with pytest.raises(ValueError, match="--nproc 100000"):
        spawn(_dies, 100000)
    assert started == []
    # memory: as many ranks as cores allow, but not their interpreters
    monkeypatch.setattr(launch_mod, "_available_memory",
                        lambda: launch_mod.RANK_START_BYTES * 2)
    with pytest.raises(ValueError, match=r"--nproc 3: each rank needs ~256 MiB"):
        launch_mod.check_local_ranks(3)
    launch_mod.check_local_ranks(2)
    # the override replaces both limits, and a bad one is named
    monkeypatch.setenv(launch_mod.MAX_RANKS_ENV, str(most + 5))
    launch_mod.check_local_ranks(most + 5)
    with pytest.raises(ValueError, match=rf"above {launch_mod.MAX_RANKS_ENV}="):
        launch_mod.check_local_ranks(most + 6)
    monkeypatch.setenv(launch_mod.MAX_RANKS_ENV, "many")
    with pytest.raises(ValueError, match="got 'many'"):
        launch_mod.check_local_ranks(2)
    monkeypatch.delenv(launch_mod.MAX_RANKS_ENV)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="one GPU per rank, 0 visible"):
            launch_mod.check_local_ranks(2, "cuda")
    with pytest.raises(ValueError, match="positive number"):
        launch_mod.check_local_ranks(0)


def test_cli_refuses_a_mistyped_nproc_with_one_line(tmp_path, capsys):
    from leangnn.cli import main

    out = tmp_path / "run"
    assert main(["train", "--strategy", "distributed", "--nproc", "100000",
                 "--epochs", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--nproc 100000" in err[0], err
    assert not out.exists()
