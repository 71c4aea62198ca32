"""Start P local ranks and make sure a dead rank ends the job, never a hang.

Two launchers, both on plain torch.distributed rendezvous:

* :func:`launch_processes` runs a command once per rank as a subprocess with
  the environment ``torchrun`` would set (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` a free port)
  and, unless the caller set it, ``OMP_NUM_THREADS`` to the rank's share of
  the cores (:func:`rank_threads`); ``leangnn train --nproc P`` uses it
  through :func:`relaunch_cli`.
* :func:`spawn` runs a Python function on P ranks (``torch.multiprocessing``)
  with the process group already initialised, and returns each rank's result.

Both watch their children: when one rank exits with an error the others are
terminated and a :class:`~leangnn.distributed.runtime.DistributedError`
names the rank and its exit status. A rank blocked in a collective with a dead
peer also fails on its own, after the process group's timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from leangnn.distributed.runtime import DEFAULT_TIMEOUT, DistContext, DistributedError
from leangnn.utils import atomic_write_text

__all__ = ["find_free_port", "launch_processes", "relaunch_cli", "spawn",
           "die_with_launcher", "rank_threads", "LAUNCHER_PID", "check_local_ranks",
           "MAX_RANKS_PER_CORE", "RANK_START_BYTES", "MAX_RANKS_ENV"]

#: environment variable that names the launcher's pid in the ranks it starts
LAUNCHER_PID = "LEANGNN_LAUNCHER_PID"


def die_with_launcher(pid: int | None = None) -> None:
    """In a rank :func:`launch_processes` (or :func:`spawn`) started: end this
    process when the launcher dies (Linux ``PR_SET_PDEATHSIG``), so a
    launcher killed with SIGKILL leaves no orphaned rank training and
    writing its run (a later ``--resume`` would be refused while they live),
    nor one waiting in a collective. ``pid``: the launcher's (default: from
    :data:`LAUNCHER_PID`). No-op elsewhere."""
    pid = pid or os.environ.get(LAUNCHER_PID)
    if not pid or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no prctl: the launcher stays in charge
        return
    if os.getppid() != int(pid):  # the launcher died before the prctl took hold
        os.kill(os.getpid(), signal.SIGTERM)


def rank_threads(nproc: int) -> int:
    """Intra-op threads per rank when ``nproc`` local ranks share this
    machine's usable cores (at least one).

    Every rank's torch would otherwise start a thread per core: ``P`` ranks
    then run ``P`` times as many threads as cores (torchrun sets 1 for the
    same reason; a share keeps a few ranks on many cores busy)."""
    return max(1, _usable_cores() // max(1, int(nproc)))


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


#: local CPU ranks per usable core a launch accepts (a few share a core
#: well enough to test a job; thousands, e.g. a mistyped ``--nproc``, would
#: start that many interpreters and stall the machine)
MAX_RANKS_PER_CORE = 4

#: resident bytes a rank needs before it trains (the interpreter with torch,
#: PyG and leangnn imported: 316 MiB measured), checked against the memory
#: available before any rank starts
RANK_START_BYTES = 256 << 20

#: set to a number of ranks to lift the CPU limits of :func:`check_local_ranks`
MAX_RANKS_ENV = "LEANGNN_MAX_LOCAL_RANKS"


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_local_ranks(nproc: int, device: str | torch.device = "cpu") -> None:
    """Refuse, before any process starts, a job of ``nproc`` local ranks this
    machine cannot hold: on CUDA, more ranks than visible GPUs (one each);
    anywhere, more than :data:`MAX_RANKS_PER_CORE` per usable core or than the
    available memory starts (:data:`RANK_START_BYTES` each), limits the
    environment variable ``LEANGNN_MAX_LOCAL_RANKS`` replaces.

    Raises:
        ValueError: naming ``--nproc``, its value and the limit.
    """
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ValueError(f"--nproc: expected a positive number of processes, "
                         f"got {nproc!r}")
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if device.index is None and nproc > visible:
            raise ValueError(f"--nproc {nproc} on {device.type}: one GPU per rank, "
                             f"{visible} visible")
    # every rank is an interpreter on this host, whatever its device
    env = os.environ.get(MAX_RANKS_ENV, "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"{MAX_RANKS_ENV}: expected a positive number of "
                             f"ranks, got {env!r}")
        if nproc > int(env):
            raise ValueError(f"--nproc {nproc}: above {MAX_RANKS_ENV}={env}")
        return
    cores = _usable_cores()
    if nproc > MAX_RANKS_PER_CORE * cores:
        raise ValueError(
            f"--nproc {nproc}: this machine has {cores} usable cores, at most "
            f"{MAX_RANKS_PER_CORE * cores} local CPU ranks (set {MAX_RANKS_ENV} "
            "to allow more; torchrun spreads a job over machines)")
    free = _available_memory()
    if free is not None and nproc * RANK_START_BYTES > free:
        raise ValueError(
            f"--nproc {nproc}: each rank needs ~{RANK_START_BYTES >> 20} MiB to "
            f"start, {free / 2**30:.1f} GiB is available (set {MAX_RANKS_ENV} to "
            "try anyway)")


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch_processes(cmd: Sequence[str], nproc: int, env: dict[str, str] | None = None,
                     timeout: float | None = None, grace: float = 5.0,
                     poll: float = 0.05, rank_args: Callable[[int], list[str]] | None
                     = None) -> int:
    """Run ``cmd`` on ``nproc`` local ranks with torchrun's environment.

    Args:
        cmd (sequence of str): the command (e.g. ``[sys.executable, "-m",
            "leangnn", "train", ...]``).
        nproc (int): number of ranks ``P``.
        env (dict, optional): extra environment variables.
        timeout (float, optional): seconds the whole job may run. (default:
            no limit)
        grace (float, optional): seconds between SIGTERM and SIGKILL when
            stopping the survivors. (default: ``5``)
        poll (float, optional): watchdog interval in seconds. (default: ``0.05``)
        rank_args (callable, optional): ``rank -> extra arguments`` appended to
            that rank's command.

    Returns:
        ``0`` when every rank succeeded.

    Raises:
        DistributedError: naming the first rank that failed (the others are
            stopped), or when ``timeout`` passed.
    """
    # every rank is a fresh interpreter: refuse what cannot start here (and
    # an nproc that is no positive int)
    check_local_ranks(nproc)
    base = {"OMP_NUM_THREADS": str(rank_threads(nproc)), **os.environ, **(env or {}),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(find_free_port()), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0"}
    procs: list[subprocess.Popen] = []
    start = time.monotonic()
    try:
        for r in range(nproc):
            extra = list(rank_args(r)) if rank_args else []
            procs.append(subprocess.Popen([*cmd, *extra], env={
                **base, "RANK": str(r), "LOCAL_RANK": str(r),
                LAUNCHER_PID: str(os.getpid())}))
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, rc) for r, rc in enumerate(codes) if rc not in (None, 0)]
            if failed:
                _stop(procs, grace)
                # A peer of a dead rank may fail too before this poll: name
                # a rank killed by a signal first (more likely the cause).
                failed.sort(key=lambda f: (f[1] >= 0, f[0]))
                more = "".join(f"; rank {r} {_describe(rc)}" for r, rc in failed[1:])
                r, rc = failed[0]
                raise DistributedError(f"rank {r} of {nproc} {_describe(rc)}{more}; "
                                       "stopped the other ranks")
            if all(rc == 0 for rc in codes):
                return 0
            if timeout is not None and time.monotonic() - start > timeout:
                _stop(procs, grace)
                raise DistributedError(f"distributed job timed out after {timeout:g} "
                                       "s; stopped all ranks")
            time.sleep(poll)
    except BaseException:
        _stop(procs, grace)
        raise


def relaunch_cli(argv: Sequence[str], nproc: int, planned: Sequence[str] | None = None,
                 **kwargs) -> int:
    """Run ``leangnn <argv>`` on ``nproc`` local ranks (``leangnn train --nproc P``).

    ``--nproc`` is removed from ``argv`` and ``--strategy distributed`` is
    set; ranks other than 0 run with ``--quiet``. With ``planned`` (the
    planner's pick for ``--strategy auto``, e.g. ``["--dist-mode", "graph"]``)
    ``--strategy auto`` and ``--memory-budget`` are replaced by those
    arguments. ``kwargs`` go to :func:`launch_processes` (e.g. ``env``).
    """
    ok = ("distributed", "auto") if planned is not None else ("distributed",)
    drop = {"--nproc"} | ({"--memory-budget"} if planned is not None else set())
    args, i = [], 0
    argv = list(argv)
    while i < len(argv):
        a = argv[i]
        if a in drop:
            i += 2
            continue
        if a.split("=", 1)[0] in drop and "=" in a:
            i += 1
            continue
        if a == "--strategy" and i + 1 < len(argv):
            if argv[i + 1] not in ok:
                raise ValueError(f"--nproc runs the distributed strategy; got "
                                 f"--strategy {argv[i + 1]}")
            i += 2
            continue
        if a.startswith("--strategy="):
            if a.split("=", 1)[1] not in ok:
                raise ValueError(f"--nproc runs the distributed strategy; got {a}")
            i += 1
            continue
        args.append(a)
        i += 1
    cmd = [sys.executable, "-m", "leangnn", *args, "--strategy", "distributed",
           *(planned or ())]
    quiet = "--quiet" in args
    return launch_processes(cmd, nproc, rank_args=lambda r: [] if quiet or r == 0
                            else ["--quiet"], **kwargs)


# ---------------------------------------------------------------------- #
def _spawn_entry(index: int, fn, nproc: int, store: str, backend: str,
                 timeout: float, threads: int | None, args: tuple, out_dir: str,
                 launcher: int) -> None:
    import torch.distributed as dist

    from leangnn.distributed.runtime import _device_for

    die_with_launcher(launcher)

    if threads:
        torch.set_num_threads(threads)
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(nproc))
    device = _device_for("cuda" if backend == "nccl" else "cpu", index)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=index,
                            world_size=nproc, timeout=timedelta(seconds=timeout))
    try:
        ctx = DistContext(index, nproc, index, backend, device)
        result = fn(ctx, *args)
        # Files, not a queue: a large result never blocks a rank on a pipe.
        torch.save(result, Path(out_dir) / f"rank{index}.pt")
    except BaseException as e:
        # When did it fail and why: the parent names the first failure, not a
        # peer's later "connection closed" (torch reports whichever it sees).
        first = (str(e).strip().splitlines() or [""])[0][:300]
        # Atomic: the parent may read it the moment this rank exits.
        atomic_write_text(Path(out_dir) / f"rank{index}.err", json.dumps(
            {"time": time.time(), "error": f"{type(e).__name__}: {first}"}))
        sys.stderr.write(f"[rank {index}] " + traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[..., Any], nproc: int, args: tuple = (), backend: str = "gloo",
          timeout: float = DEFAULT_TIMEOUT, join_timeout: float | None = None,
          start_method: str = "spawn", threads: int | None = 1) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``nproc`` ranks with a process group ready.

    Args:
        fn (callable): ``fn(ctx: DistContext, *args)``; importable by name
            unless ``start_method="fork"``.
        nproc (int): number of ranks.
        args (tuple, optional): further arguments (pickled for ``spawn``).
        backend (str, optional): ``"gloo"`` or ``"nccl"`` (device
            ``cuda:rank``). (default: ``"gloo"``)
        timeout (float, optional): process-group timeout in seconds.
        join_timeout (float, optional): seconds the whole job may run.
        start_method (str, optional): ``"spawn"`` (safe anywhere) or
            ``"fork"`` (no re-import; CPU only). (default: ``"spawn"``)
        threads (int, optional): torch threads per rank. (default: ``1``)

    Returns:
        The results of ``fn`` in rank order.

    Raises:
        DistributedError: a rank raised or died (the others are terminated),
            or ``join_timeout`` passed.
    """
    import torch.multiprocessing as mp

    if backend == "nccl" and start_method == "fork":
        raise ValueError("spawn: CUDA ranks need start_method='spawn'")
    check_local_ranks(nproc, "cuda" if backend == "nccl" else "cpu")
    with tempfile.TemporaryDirectory(prefix="leangnn-dist-") as tmp:
        ctx = mp.start_processes(
            _spawn_entry, args=(fn, nproc, os.path.join(tmp, "store"), backend,
                                timeout, threads, args, tmp, os.getpid()),
            nprocs=nproc, join=False, start_method=start_method)
        start = time.monotonic()
        try:
            while not ctx.join(timeout=0.1):
                if join_timeout is not None and time.monotonic() - start > join_timeout:
                    raise DistributedError(f"distributed job timed out after "
                                           f"{join_timeout:g} s; stopped all ranks")
        except (mp.ProcessExitedException, mp.ProcessRaisedException):
            _terminate(ctx.processes)
            raise _first_failure(ctx.processes, Path(tmp), nproc) from None
        finally:
            _terminate(ctx.processes)
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False)
                for r in range(nproc)]


def _terminate(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


def _first_failure(procs, folder: Path, nproc: int) -> DistributedError:
    """The failure that started it: a rank that died without raising (killed,
    ``os._exit``), else the earliest exception; the watchdog's own SIGTERMs
    are consequences."""
    errors = {}
    for r in range(nproc):
        f = folder / f"rank{r}.err"
        if f.is_file():
            errors[r] = json.loads(f.read_text())
    for r, p in enumerate(procs):
        if p.exitcode not in (None, 0, -signal.SIGTERM) and r not in errors:
            return DistributedError(f"rank {r} of {nproc} {_describe(p.exitcode)}; "
                                    "stopped the other ranks")
    if errors:
        r = min(errors, key=lambda k: errors[k]["time"])
        return DistributedError(f"rank {r} of {nproc} raised: {errors[r]['error']}; "
                                "stopped the other ranks")
    return DistributedError(f"a rank of {nproc} failed; stopped the other ranks")
