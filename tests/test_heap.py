"""glibc heap controls: page release, the arena cap, the arena count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from leangnn.heap import limit_malloc_arenas, malloc_arena_count, release_free_heap
from leangnn.profile import rss_bytes

MiB = 1 << 20
GLIBC = sys.platform.startswith("linux") and malloc_arena_count() is not None

# Four threads each allocate 24 MiB in 64 KiB blocks (below glibc's mmap
# threshold, so from an arena) and free every other one, leaving holes that
# no heap top can give back; then the main thread allocates 48 MiB the same
# way. 96 MiB stay live. With one arena the main thread fills the threads'
# holes; with an arena per thread they stay mapped: 48 MiB more resident.
_SCRIPT = textwrap.dedent("""
    import json, sys, threading
    from leangnn.heap import limit_malloc_arenas, malloc_arena_count
    from leangnn.profile import rss_bytes
    capped = limit_malloc_arenas()
    start = rss_bytes()
    keep, bar = [], threading.Barrier(4)
    def block():  # touched: calloc'd pages would not be resident yet
        b = bytearray(64 * 1024)
        b[::4096] = b"x" * 16
        return b
    def work():
        bar.wait()
        blocks = [block() for _ in range(384)]
        keep.append(blocks[1::2])
    ts = [threading.Thread(target=work) for _ in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    main = [block() for _ in range(768)]
    print(json.dumps({"capped": capped, "arenas": malloc_arena_count(),
                      "growth": rss_bytes() - start}))
""")


def _child(**env) -> dict:
    e = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", _SCRIPT], env=e, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_release_free_heap_returns_interior_holes():
    # 64 KiB blocks come from the heap (below glibc's mmap threshold); freeing
    # every other one leaves holes between live blocks that the heap top
    # cannot give back, only malloc_trim's page release can.
    if not sys.platform.startswith("linux"):
        assert release_free_heap() in (True, False)
        return
    blocks = [bytearray(64 * 1024) for _ in range(1600)]  # 100 MiB, touched
    del blocks[::2]
    before = rss_bytes()
    assert release_free_heap()
    after = rss_bytes()
    assert before - after >= 25 * MiB, (before / MiB, after / MiB)
    assert all(len(b) == 64 * 1024 and b[-1] == 0 for b in blocks)  # intact


@pytest.mark.skipif(not GLIBC, reason="glibc malloc arenas only")
def test_arena_cap_reuses_worker_threads_free_memory():
    capped = _child()  # the default: one arena
    off = _child(LEANGNN_MALLOC_ARENAS="0")  # the off switch
    assert capped["capped"] and capped["arenas"] == 1
    assert not off["capped"] and off["arenas"] >= 2
    # the saving: the main thread's 48 MiB land in the threads' 48 MiB of holes
    assert capped["growth"] <= (96 + 8) * MiB, capped
    assert off["growth"] >= (96 + 40) * MiB, off
    # glibc's own environment variable wins over ours
    env = _child(MALLOC_ARENA_MAX="4")
    assert not env["capped"]


def test_arena_cap_arguments():
    with pytest.raises(ValueError, match="max_arenas must be >= 0, got -1"):
        limit_malloc_arenas(-1)
    os.environ["LEANGNN_MALLOC_ARENAS"] = "one"
    try:
        with pytest.raises(ValueError, match="LEANGNN_MALLOC_ARENAS.*'one'"):
            limit_malloc_arenas()
    finally:
        del os.environ["LEANGNN_MALLOC_ARENAS"]
    assert limit_malloc_arenas(0) is False


def _metrics(out) -> list[dict]:
    recs = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for ln in f:
            rec = json.loads(ln)
            rec.pop("epoch_seconds")
            rec.pop("epoch_cpu_seconds")
            recs.append(rec)
    return recs


@pytest.mark.skipif(not GLIBC, reason="glibc malloc arenas only")
def test_cli_results_equal_with_and_without_the_cap(tmp_path):
    # two intra-op threads so that worker threads allocate
    args = ["--dataset", "iscas85/c17,misc/mux_4,epfl/ctrl", "--val-dataset",
            "misc/mux_2", "--test-dataset", "misc/switch", "--model", "res",
            "--layers", "2", "--hidden", "8", "--epochs", "2", "--quiet", "--force"]
    runs = {}
    for name, arenas in (("on", "1"), ("off", "0")):
        env = dict(os.environ, LEANGNN_MALLOC_ARENAS=arenas, OMP_NUM_THREADS="2")
        env.pop("MALLOC_ARENA_MAX", None)
        out = str(tmp_path / name)
        r = subprocess.run([sys.executable, "-m", "leangnn", "train", *args,
                            "--out", out], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        runs[name] = out
    assert _metrics(runs["on"]) == _metrics(runs["off"])
