"""Calibration runs: repeats, reuse of stored measurements, failures."""

from __future__ import annotations

import json

import pytest

import leangnn.plan.calibrate as cmod
from leangnn.plan.estimate import Estimate


def test_calibrate_repeats_reuses_and_skips_failures(tmp_path, monkeypatch,
                                                      capsys):
    # the runs are stubbed: what is checked is the bookkeeping (median of
    # repeats, measurements kept and reused, a failing run left out)
    import leangnn.data
    import leangnn.plan.calibrate as cmod
    import leangnn.plan.estimate

    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    runs = [dict(strategy="full", model="gcn", num_layers=2, hidden_channels=8,
                 dataset="csbm:100"),
            dict(strategy="full", model="gat", num_layers=2, hidden_channels=8,
                 dataset="csbm:100"),
            dict(strategy="full", model="sage", num_layers=2, hidden_channels=8,
                 dataset="csbm:100")]
    monkeypatch.setattr(cmod, "CALIBRATION_RUNS", runs)
    monkeypatch.setattr(leangnn.data, "load_graphs", lambda cfg, progress: None)

    def fake_estimate(cfg, splits):
        if cfg.model == "gat":
            raise RuntimeError("a dry run that fails")
        return Estimate(cfg.strategy, {"model": cfg.model}, "cpu",
                        step_bytes=10 << 20, big_bytes=2 << 20, heap_bytes=8 << 20,
                        work={"ops": 10, "written": 1e6, "flops": 1e6, "graphs": 1})

    monkeypatch.setattr(leangnn.plan.estimate, "estimate_config", fake_estimate)
    calls = []

    def fake_measure(cfg, device, mmap, timeout, planned=False):
        calls.append(cfg.model)
        peak = {"gcn": [30, 10, 20], "sage": [50, 70, 60]}[cfg.model]
        i = sum(c == cfg.model for c in calls) - 1
        return {"run_bytes": peak[i % 3] << 20, "epoch_seconds": [0.5],
                "epoch_cpu_seconds": [0.4], "baseline_bytes": 0}

    monkeypatch.setattr(cmod, "_measure", fake_measure)
    cal = cmod.calibrate("cpu", mmap=False, repeat=3, save=False, progress=False)
    assert calls == ["gcn"] * 3 + ["sage"] * 3  # gat's estimate failed: not run
    assert [s["run_bytes"] for s in cal.samples] == [20 << 20, 60 << 20]
    assert [s["run_bytes_all"] for s in cal.samples] == [
        [10 << 20, 20 << 20, 30 << 20], [50 << 20, 60 << 20, 70 << 20]]
    stored = json.loads(cmod.measurements_path("cpu", False).read_text())
    assert len(stored[cmod._run_key(runs[0])]) == 3
    again = cmod.calibrate("cpu", mmap=False, repeat=3, save=False, progress=False,
                           reuse=True)
    assert len(calls) == 6  # everything reused
    assert [s["run_bytes"] for s in again.samples] == [20 << 20, 60 << 20]
    # a damaged store (truncated JSON) is said and measured anew, not reused
    path = cmod.measurements_path("cpu", False)
    path.write_text(path.read_text()[:40])
    capsys.readouterr()
    fresh = cmod.calibrate("cpu", mmap=False, repeat=3, save=False, progress=False,
                           reuse=True)
    assert "unreadable" in capsys.readouterr().err
    assert len(calls) == 12
    assert [s["run_bytes"] for s in fresh.samples] == [20 << 20, 60 << 20]


def test_save_reference_ships_the_stored_calibration(tmp_path, monkeypatch, capsys):
    import pytest

    import leangnn.plan.calibrate as cmod
    from leangnn.plan.calibration import Calibration, allocator_mode, machine_kind

    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(cmod, "REFERENCE_DIR", tmp_path / "reference")
    # nothing measured here: one usage error, nothing written
    with pytest.raises(SystemExit) as e:
        cmod.main(["--save-reference"])
    assert e.value.code == 2 and "no stored calibration" in capsys.readouterr().err
    assert not (tmp_path / "reference").exists()
    mine = Calibration(machine_kind("cpu"), allocator_mode("cpu"), scale=1.7,
                       heap_scales={"sage": 2.2}, calibrated=True,
                       measured_at="2026-12-01 05:00:00",
                       samples=[{"config": {}, "run_bytes": 1.0}])
    mine.save()
    assert cmod.main(["--save-reference"]) == 0
    shipped = json.loads((tmp_path / "reference"
                          / f"{allocator_mode('cpu')}.json").read_text())
    assert shipped["samples"] == [] and shipped["heap_scales"] == {"sage": 2.2}
    assert shipped["reference"] == f"{mine.kind}, 2026-12-01 05:00:00"


def test_calibration_runs_cover_each_op_mix_on_both_graph_kinds():
    # one run per op mix let its process-to-process spread and its graph
    # decide the factor (offload GCN x2.8 from one csbm run where the
    # benchmark's row needs x2.1): the mixes fitted from few runs have
    # several, on a circuit and on a csbm graph
    from leangnn.plan.calibrate import CALIBRATION_RUNS
    from leangnn.plan.calibration import heap_families

    kinds: dict[str, set[str]] = {}
    for run in CALIBRATION_RUNS:
        fams = heap_families(run["strategy"], run)
        if run["strategy"] == "offload":
            fams = [f"offload-{f}" for f in fams]
        kind = "csbm" if run["dataset"].startswith("csbm:") else "circuit"
        for fam in fams:
            kinds.setdefault(fam, set()).add(kind)
    for fam in ("offload-gcn", "offload-sage", "gsr-gat", "res-gcn", "gat", "gcn",
                "sage", "res-sage", "gsr-sage", "gsr-gcn", "prune-sage"):
        assert kinds.get(fam) == {"csbm", "circuit"}, fam


def test_long_runs_add_their_scales_to_the_stored_calibration(tmp_path, monkeypatch,
                                                              capsys):
    # the runs are stubbed: checked is what is trained (every calibration run
    # for the epochs asked, every epoch: patience off), what is stored, and
    # the usage errors
    import pytest

    import leangnn.plan.calibrate as cmod
    import leangnn.plan.measure
    from leangnn.plan.calibration import Calibration, load_calibration, machine_kind

    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    runs = [dict(strategy="reversible", model="gsr", conv="sage", num_layers=8,
                 hidden_channels=8, dataset="csbm:100"),
            dict(strategy="full", model="sage", num_layers=2, hidden_channels=8,
                 dataset="csbm:100"),
            dict(strategy="full", model="gat", num_layers=2, hidden_channels=8,
                 dataset="csbm:100")]
    monkeypatch.setattr(cmod, "CALIBRATION_RUNS", runs)
    calls = []

    def fake_trainer(cfg, epochs, threads, mmap, timeout):
        calls.append((cfg["model"], epochs, cfg["patience"]))
        if cfg["model"] == "gat":
            raise RuntimeError("training full/gat failed: out of memory")
        top = {"gsr": 13, "sage": 11 if epochs < 8 else 12}[cfg["model"]]
        return {"epoch_peak_bytes": [10, 10, 10] + [top] * (epochs - 3)}

    monkeypatch.setattr(leangnn.plan.measure, "measure_trainer", fake_trainer)
    # this machine's kind (with none stored, load_calibration gives the
    # reference, measured on another machine kind)
    base = Calibration(machine_kind("cpu"), "glibc-default",
                       calibrated=True, budget_scale=1.1)
    base.save()
    cal = cmod.calibrate_long_runs("cpu", epochs=6, progress=False)
    assert calls == [("gsr", 6, 0), ("sage", 6, 0), ("gat", 6, 0)]
    assert "full/gat L2 csbm:100: left out (RuntimeError" in capsys.readouterr().err
    assert cal.long_run_scales["gsr-sage"] == pytest.approx(1.3)
    assert cal.long_run_scales["sage"] == pytest.approx(1.1)
    stored = load_calibration("cpu")
    assert stored.long_run_scales == cal.long_run_scales
    kept = json.loads(cmod.measurements_path("cpu", False).with_suffix(
        ".long.json").read_text())  # the runs, for a refit
    assert [r["config"]["model"] for r in kept] == ["gsr", "sage"]
    # a refit of the kept runs trains nothing; a truncated file is said and
    # measured anew
    again = cmod.calibrate_long_runs("cpu", epochs=6, progress=False, reuse=True)
    assert len(calls) == 3 and again.long_run_scales == cal.long_run_scales
    path = cmod.long_runs_path("cpu", False)
    path.write_text(path.read_text()[:30])
    capsys.readouterr()
    cmod.calibrate_long_runs("cpu", epochs=6, progress=False, reuse=True)
    assert "unreadable" in capsys.readouterr().err and len(calls) == 6
    assert json.loads(path.read_text()) == kept
    assert stored.budget_scale == 1.1  # the rest as it was
    # one family alone: its runs trained, its scales changed, the others' kept
    # (scales and stored runs)
    before = dict(load_calibration("cpu").long_run_scales)
    fam = cmod.calibrate_long_runs("cpu", epochs=8, progress=False,
                                   families=["sage"])
    assert calls[6:] == [("sage", 8, 0)]
    assert before["sage"] == pytest.approx(1.1)
    assert fam.long_run_scales == {**before, "sage": pytest.approx(1.2)}
    assert [r["config"]["model"] for r in json.loads(path.read_text())] == \
        ["gsr", "sage"]
    with pytest.raises(ValueError, match="no calibration run of"):
        cmod.calibrate_long_runs("cpu", families=["nope"])
    for argv, msg in ((["--long-runs", "3"], "more than 3 epochs, got 3"),
                      (["--long-runs", "--device", "cuda"], "CPU only")):
        with pytest.raises(SystemExit) as e:
            cmod.main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err


def test_calibrate_families_fits_one_family_and_keeps_the_rest(tmp_path,
                                                                monkeypatch):
    # the runs are stubbed: what is checked is which runs are measured and
    # that the one family's factor is the one its runs imply, beside the
    # stored calibration's other factors, constant and time left as they are
    import pytest

    import leangnn.data
    import leangnn.plan.calibrate as cmod
    import leangnn.plan.estimate
    from leangnn.plan.calibration import load_calibration

    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    before = load_calibration("cpu")  # the shipped reference here
    runs = [dict(strategy="full", model="gcn", num_layers=2, dataset="csbm:100"),
            dict(strategy="full", model="dag", dataset="iscas85/c17"),
            dict(strategy="full", model="dag", rounds=2, dataset="iscas85/c432"),
            # next to no tensors: the DAG model's own first-run constant
            dict(strategy="full", model="dag", rounds=3, dataset="iscas85/c17")]
    monkeypatch.setattr(cmod, "CALIBRATION_RUNS", runs)
    monkeypatch.setattr(leangnn.data, "load_graphs", lambda cfg, progress: None)
    heap = {1: 20 << 20, 2: 40 << 20, 3: 100_000}
    more = 2e6  # what a DAG run pays beyond the plain models' constant

    def fake_estimate(cfg, splits):
        return Estimate(cfg.strategy, {"model": cfg.model}, "cpu",
                        step_bytes=heap[cfg.rounds], big_bytes=0,
                        heap_bytes=heap[cfg.rounds],
                        work={"ops": 10, "written": 1e6, "flops": 1e6, "graphs": 1})

    monkeypatch.setattr(leangnn.plan.estimate, "estimate_config", fake_estimate)
    measured = []

    def fake_measure(cfg, device, mmap, timeout, planned=False):
        measured.append(cfg.model)
        # resident = 1.7 x heap + the DAG model's constant (the tiny run: its
        # heap as it is)
        factor = 1.0 if cfg.rounds == 3 else 1.7
        return {"run_bytes": factor * heap[cfg.rounds] + before.const + more,
                "epoch_seconds": [0.5], "epoch_cpu_seconds": [0.4],
                "baseline_bytes": 0}

    monkeypatch.setattr(cmod, "_measure", fake_measure)
    cal = cmod.calibrate_families(["dag"], "cpu", mmap=False, progress=False)
    assert measured == ["dag"] * 3  # gcn's run is not measured again
    # the family and its finer op mix (both runs have 32 channels: wide),
    # fitted on what the family's own constant leaves
    assert cal.family_consts["dag"] == pytest.approx(before.const + more)
    assert cal.family_consts["dag-wide"] == pytest.approx(before.const + more)
    assert cal.heap_scales["dag"] == pytest.approx(1.7)
    assert cal.heap_scales["dag-wide"] == pytest.approx(1.7)
    assert {k: v for k, v in cal.heap_scales.items() if not k.startswith("dag")} \
        == {k: v for k, v in before.heap_scales.items() if not k.startswith("dag")}
    assert (cal.const, cal.per_op, cal.heap_scale) == \
        (before.const, before.per_op, before.heap_scale)
    # its epoch time: 0.4 s CPU measured against what the work estimates
    assert cal.time_scales["dag"] == pytest.approx(0.4 / before.seconds(
        {"ops": 10, "written": 1e6, "flops": 1e6}))
    assert load_calibration("cpu").heap_scales["dag"] == pytest.approx(1.7)
    # stamped as a refit, the whole calibration's date kept
    # (on a machine of another kind than the reference's, also where from)
    assert set(cal.refitted) - {"reference"} == {*before.refitted, "heap dag"}
    assert cal.measured_at == before.measured_at
    with pytest.raises(ValueError, match=r"no calibration run of \['nope'\]"):
        cmod.calibrate_families(["nope"], "cpu")
    assert cmod.main(["--family", "dag", "--repeat", "1", "--reuse"]) == 0


def test_a_refit_of_the_reference_is_stored_as_this_machines(tmp_path, monkeypatch):
    # the shipped reference was measured on another machine kind: a partial
    # refit on top of it is stored (and read back) as this machine's, with
    # where it came from kept
    import leangnn.plan.calibrate as cmod
    import leangnn.plan.calibration as calmod
    from leangnn.plan.calibration import load_calibration

    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    ref = load_calibration("cpu")
    assert ref.reference  # nothing stored: the shipped one
    for mod in (cmod, calmod):
        monkeypatch.setattr(mod, "machine_kind", lambda device: "cpu-test-box")
    base = cmod._refit_base("cpu")
    assert (base.kind, base.reference) == ("cpu-test-box", "")
    assert base.refitted["reference"] == ref.reference
    assert (base.heap_scales, base.const) == (ref.heap_scales, ref.const)
    base.stamp("time")
    base.save()
    back = load_calibration("cpu")
    assert (back.kind, back.reference) == ("cpu-test-box", "")
    assert "time" in back.refitted
    # this machine's stored calibration is the base from then on, as it is
    assert cmod._refit_base("cpu").refitted == back.refitted


def test_calibrate_time_fits_the_time_terms_and_keeps_the_memory_fit(
        tmp_path, monkeypatch, capsys):
    # stubbed runs whose CPU seconds follow known time terms: the fit finds
    # them; heap factors, constant and margin stay the stored calibration's
    import pytest

    import leangnn.data
    import leangnn.plan.calibrate as cmod
    import leangnn.plan.estimate
    from leangnn.plan.calibration import load_calibration

    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    before = load_calibration("cpu")
    works = {n: {"ops": 100.0 * n, "written": 1e8 * (n % 3 + 1),
                 "big_written": 5e7 * (n % 2) * n, "flops": 1e9 * (7 - n) ** 2,
                 "graphs": 1}
             for n in range(1, 7)}
    runs = [dict(strategy="full", model="sage", num_layers=n, dataset="csbm:100")
            for n in works]
    monkeypatch.setattr(cmod, "CALIBRATION_RUNS", runs)
    monkeypatch.setattr(leangnn.data, "load_graphs", lambda cfg, progress: None)

    def fake_estimate(cfg, splits):
        return Estimate(cfg.strategy, {"model": cfg.model}, "cpu", step_bytes=1 << 20,
                        work=works[cfg.num_layers])

    def seconds(w):
        return 1e-5 * w["ops"] + 2e-10 * w["written"] + 6e-10 * w["big_written"] \
            + 1e-12 * w["flops"]

    monkeypatch.setattr(leangnn.plan.estimate, "estimate_config", fake_estimate)
    def fake_measure(cfg, device, mmap, timeout, planned=False):
        return {"run_bytes": 9 << 20, "epoch_seconds": [1.0],
                "epoch_cpu_seconds": [seconds(works[cfg.num_layers])],
                "baseline_bytes": 0}

    monkeypatch.setattr(cmod, "_measure", fake_measure)
    cal = cmod.calibrate_time("cpu", mmap=False, progress=False)
    assert (cal.per_op, cal.per_byte, cal.per_big_byte, cal.per_flop) == \
        pytest.approx((1e-5, 2e-10, 6e-10, 1e-12), rel=1e-4)
    assert (cal.const, cal.heap_scales, cal.budget_scale) == \
        (before.const, before.heap_scales, before.budget_scale)
    assert load_calibration("cpu").per_big_byte == pytest.approx(6e-10, rel=1e-4)
    assert "time" in load_calibration("cpu").refitted
    assert cal.measured_at == before.measured_at
    assert cmod.main(["--time-only", "--repeat", "1", "--reuse"]) == 0
    assert "ns/B more in fresh pages" in capsys.readouterr().out


@pytest.mark.parametrize("argv,named", [
    (["--time-only", "--collectives", "2"], "--collectives"),
    (["--show", "--long-runs"], "--long-runs"),
    (["--save-reference", "--time-only"], "--time-only"),
    (["--family", "dag", "--time-only"], "--family"),
    (["--family", "dag", "--collectives", "2"], "--family"),
    (["--time-only", "--quick"], "--quick"),
    (["--family", "dag", "--quick"], "--quick"),
])
def test_two_jobs_in_one_call_are_refused_naming_the_flags(argv, named, capsys,
                                                           monkeypatch):
    # nothing may run: a refused call measured the first flag's job before
    def ran(*a, **k):
        raise AssertionError("a refused call ran a calibration")

    for name in ("calibrate", "calibrate_time", "calibrate_collectives",
                 "calibrate_long_runs", "calibrate_families", "save_reference"):
        monkeypatch.setattr(cmod, name, ran)
    with pytest.raises(SystemExit) as e:
        cmod.main(argv)
    assert e.value.code == 2
    assert named in capsys.readouterr().err


def test_runs_measured_in_the_heap_asked_for(monkeypatch):
    import sys

    from leangnn.heap import compact_heap_env, heap_mode
    from leangnn.plan.calibrate import _kind
    from leangnn.plan.measure import _heap_env

    if not sys.platform.startswith("linux"):
        return
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", compact_heap_env({})["GLIBC_TUNABLES"])
    # the children of a calibration in the compact heap get it, and the
    # stored calibration is named after it; with mmap, glibc's fixed
    # threshold alone
    assert heap_mode(_heap_env(False)) == "compact"
    assert _kind("cpu", False).endswith("glibc-compact")
    assert heap_mode(_heap_env(True)) == "mmap"
    assert "tcache_count" not in _heap_env(True).get("GLIBC_TUNABLES", "")
    assert _kind("cpu", True).endswith("glibc-mmap")


def test_a_cuda_calibration_leaves_the_planned_runs_out(monkeypatch, tmp_path,
                                                        capsys):
    # a plan in the training process pays host code (a CPU figure): a CUDA
    # calibration does not train those runs, a CPU one does
    import leangnn.plan.calibrate as cmod
    from leangnn.plan.calibration import PLANNED

    seen = {}

    def fake_sample(run, *args, **kwargs):
        seen["runs"].append(run)
        raise RuntimeError("not measured here")

    monkeypatch.setattr(cmod, "_sample", fake_sample)
    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    for device, kept in (("cuda", False), ("cpu", True)):
        # every path that measures runs (the whole calibration, --family)
        seen["runs"] = []
        cmod._measure_runs(cmod.CALIBRATION_RUNS, device, False, None, 1, False,
                           False)
        assert seen["runs"]
        assert any(r.get(PLANNED) for r in seen["runs"]) == kept, device
