"""Calibration: the fit recovers known coefficients; storage per machine kind."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from leangnn.plan.calibration import (
    PLANNED,
    Calibration,
    allocator_mode,
    calibration_label,
    calibration_path,
    fit_calibration,
    is_planned,
    load_calibration,
    machine_kind,
)
from leangnn.plan.estimate import Estimate


def _samples(scale, const, per_op, per_byte, per_flop):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(6):
        t = float(rng.uniform(1e6, 1e9))
        work = {"ops": float(rng.integers(100, 5000)), "written": float(t * 3),
                "flops": float(rng.uniform(1e8, 1e11)), "graphs": 1}
        sec = per_op * work["ops"] + per_byte * work["written"] + \
            per_flop * work["flops"]
        out.append({"tensor_bytes": t, "run_bytes": scale * t + const,
                    "work": work, "epoch_seconds": sec})
    return out


def test_fit_recovers_memory_and_time_coefficients():
    cal = fit_calibration(_samples(1.3, 5e6, 2e-5, 1e-9, 3e-10))
    assert cal.calibrated
    assert cal.scale == pytest.approx(1.3, rel=1e-6)
    assert cal.const == pytest.approx(5e6, rel=1e-4)
    assert cal.error["worst"] < 1e-6
    assert (cal.per_op, cal.per_byte, cal.per_flop) == pytest.approx(
        (2e-5, 1e-9, 3e-10), rel=1e-4)


@pytest.mark.parametrize("key,name,price,part_of", [
    # big blocks cost more per byte than heap writes (the reference box:
    # ~0.55 ns/B more)
    ("big_written", "per_big_byte", 5e-10, "written"),
    # sparse products (GSR's CSR kernels, DPR's adjacency) cost more per
    # FLOP than dense ones
    ("sparse_flops", "per_sparse_flop", 1.5e-10, "flops"),
])
def test_fit_prices_a_share_of_the_work_apart(key, name, price, part_of):
    """Samples whose share ``key`` of ``part_of`` costs ``price`` more: the
    fit finds both terms, and a work without that share pays none of it."""
    rng = np.random.default_rng(1)
    samples = []
    for _ in range(10):
        work = {"ops": float(rng.integers(100, 5000)),
                "written": float(rng.uniform(1e8, 1e10)),
                "flops": float(rng.uniform(1e8, 1e11)), "graphs": 1}
        work[key] = work[part_of] * float(rng.uniform(0, 0.9))
        sec = 2e-5 * work["ops"] + 1e-10 * work["written"] + \
            price * work[key] + 3e-12 * work["flops"]
        samples.append({"tensor_bytes": 1e6, "run_bytes": 1e6, "work": work,
                        "epoch_seconds": sec})
    cal = fit_calibration(samples)
    assert (cal.per_op, cal.per_byte, getattr(cal, name), cal.per_flop) == \
        pytest.approx((2e-5, 1e-10, price, 3e-12), rel=1e-4)
    assert cal.seconds(samples[0]["work"]) == pytest.approx(
        samples[0]["epoch_seconds"])
    # a work without the term (a DAG sweep's, an old sample's) prices none
    old = {k: v for k, v in samples[0]["work"].items() if k != key}
    assert cal.seconds(old) == pytest.approx(
        samples[0]["epoch_seconds"] - price * samples[0]["work"][key])


def test_time_fit_keeps_to_the_terms_its_samples_tell_apart():
    # CUDA (no heap threshold): every byte is a "fresh" one, the extra
    # terms say nothing new; a quick calibration's four runs fit three terms
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)
    for s in samples:
        s["work"]["big_written"] = s["work"]["cold_written"] = s["work"]["written"]
    cal = fit_calibration(samples)
    assert (cal.per_op, cal.per_byte, cal.per_flop) == pytest.approx(
        (2e-5, 1e-9, 3e-10), rel=1e-4)
    assert cal.per_cold_byte == cal.per_big_byte == 0.0
    cal = fit_calibration(_samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)[:4])
    assert (cal.per_op, cal.per_byte, cal.per_flop) == pytest.approx(
        (2e-5, 1e-9, 3e-10), rel=1e-4)


def test_offload_samples_get_their_own_byte_scale():
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)
    off = dict(samples[0], work={**samples[0]["work"], "jobs": 40},
               run_bytes=0.8 * samples[0]["tensor_bytes"])
    cal = fit_calibration([*samples, off])
    assert cal.scale == pytest.approx(1.0) and cal.offload_bytes_scale == \
        pytest.approx(0.8)
    est = Estimate("offload", {}, "cpu", step_bytes=1000, method="offload-accounting",
                   work={"ops": 10, "written": 0, "flops": 0, "jobs": 5})
    cal.apply(est)
    assert est.run_bytes == 800
    assert est.epoch_seconds == pytest.approx(
        cal.offload_scale * 10 * cal.per_op + 5 * cal.per_job)


def test_apply_adds_overhead_and_time():
    cal = Calibration("k", "glibc-mmap", scale=2.0, const=10.0, per_op=1.0,
                      per_byte=0.0, per_flop=0.0, calibrated=True)
    est = Estimate("full", {}, "cpu", step_bytes=100, model_bytes=7, graph_bytes=3,
                   work={"ops": 4, "written": 0, "flops": 0})
    cal.apply(est)
    assert est.overhead_bytes == 110 and est.run_bytes == 210
    assert est.peak_bytes == 220 and est.epoch_seconds == 4.0
    assert est.note == ""
    Calibration.default().apply(est)
    assert "uncalibrated" in est.note


def test_machine_kind_names_the_allocator(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    default = machine_kind("cpu")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert allocator_mode("cpu") in ("glibc-mmap", "system")
    assert machine_kind("cpu") != default or allocator_mode("cpu") == "system"
    assert machine_kind("cpu").startswith("cpu-")


def test_store_and_load_per_machine_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    # nothing stored: defaults (the shipped reference switched off)
    assert not load_calibration("cpu", reference=False).calibrated
    cal = fit_calibration(_samples(1.1, 0.0, 1e-5, 1e-9, 1e-10))
    path = cal.save()
    assert path == calibration_path("cpu") and path.parent == tmp_path / "calibration"
    back = load_calibration("cpu")
    assert back.calibrated and back.scale == pytest.approx(cal.scale)
    assert json.loads(path.read_text())["kind"] == machine_kind("cpu")
    path.write_text("{not json")
    # damaged: defaults, no crash, and said (naming the file)
    with pytest.warns(UserWarning, match=f"{path}: damaged calibration ignored"):
        assert not load_calibration("cpu", reference=False).calibrated
    # a field of the wrong kind (hand-edited, another version's): the same,
    # naming the field, never a TypeError in the middle of a plan
    for field, bad in (("per_op", "fast"), ("per_sparse_flop", float("nan")),
                       ("heap_scales", [1.0]), ("calibrated", "yes")):
        path.write_text(json.dumps({**cal.to_dict(), field: bad}))
        with pytest.warns(UserWarning, match=f"field '{field}': expected"):
            assert not load_calibration("cpu", reference=False).calibrated
    # an optional coefficient may be null; an old file's missing field is its
    # default
    path.write_text(json.dumps({**cal.to_dict(), "offload_host_scale": None}))
    assert load_calibration("cpu", reference=False).calibrated
    with pytest.raises(ValueError, match="expected a JSON object"):
        Calibration.from_dict([1, 2])


def test_cpu_fit_splits_big_blocks_and_heap(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)
    for i, s in enumerate(samples):
        s["big_bytes"] = 0.8 * s["tensor_bytes"]
        s["heap_bytes"] = (0.1 + 0.05 * i) * s["tensor_bytes"]
        s["run_bytes"] = s["big_bytes"] + 1.7 * s["heap_bytes"] + 3e6
    cal = fit_calibration(samples, "cpu")
    if cal.allocator != "glibc-mmap":
        pytest.skip("not a glibc system")
    assert cal.heap_scale == pytest.approx(1.7, rel=1e-4)
    assert cal.const == pytest.approx(3e6, rel=1e-3)
    est = Estimate("full", {}, "cpu", step_bytes=1000, big_bytes=800, heap_bytes=100)
    cal.apply(est)
    assert est.run_bytes == pytest.approx(800 + 170 + 3e6, abs=1)


def test_default_glibc_fit_is_conservative(monkeypatch):
    # Under glibc's dynamic threshold the heap's fragmentation depends on the
    # model: the fit takes the largest factor measured, so plans err on the
    # side of "does not fit".
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)
    for s, factor in zip(samples, (1.1, 2.1, 1.5, 1.9, 1.2, 1.6)):
        s["big_bytes"], s["heap_bytes"] = 0.0, float(32 << 20)
        s["run_bytes"] = factor * s["heap_bytes"]
    cal = fit_calibration(samples, "cpu")
    if cal.allocator != "glibc-default":
        pytest.skip("not a glibc system")
    assert cal.heap_scale == pytest.approx(2.1) and cal.const == 0.0


def test_default_glibc_fit_takes_the_first_run_constant_from_a_tiny_run(
        monkeypatch):
    # a run with next to no tensors measures what every run pays besides
    # them (kernels' first calls, validation, checkpoints): the constant;
    # the heap factor is then fitted on what is left, and offload runs pay
    # the constant on top of their scaled store
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    const = 8e6
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)
    samples[0].update(big_bytes=1000.0, heap_bytes=4000.0,
                      run_bytes=1000.0 + 4000.0 + const)
    for s, factor in zip(samples[1:], (1.2, 1.6, 1.4)):
        s["big_bytes"], s["heap_bytes"] = 5e6, float(32 << 20)
        s["run_bytes"] = s["big_bytes"] + factor * s["heap_bytes"] + const
    off = [dict(s, work={**s["work"], "jobs": 10, "device_bytes": 1.0,
                         "host_bytes": 1.0},
                run_bytes=0.9 * s["tensor_bytes"] + const) for s in samples[4:6]]
    cal = fit_calibration(samples[:4] + off, "cpu")
    if cal.allocator != "glibc-default":
        pytest.skip("not a glibc system")
    assert cal.const == pytest.approx(const)
    assert cal.heap_scale == pytest.approx(1.6)
    assert cal.offload_bytes_scale == pytest.approx(0.9)
    est = Estimate("offload", {}, "cpu", step_bytes=1000, method="offload-accounting",
                   work={"ops": 1, "written": 0, "flops": 0, "jobs": 1,
                         "device_bytes": 600, "host_bytes": 400})
    cal.apply(est)
    assert est.run_bytes == pytest.approx(900 + const, abs=1)


def test_heap_families_most_specific_first():
    from leangnn.plan.calibration import heap_families

    assert heap_families("full", {"model": "gat"}) == ["gat"]
    assert heap_families("reversible", {"model": "gsr", "conv": "gcn"}) == \
        ["gsr-gcn", "gsr"]
    assert heap_families("prune", {"model": "res", "conv": "sage"}) == \
        ["prune-res-sage", "prune-res", "prune"]
    assert heap_families("full", {}) == []  # a user's own module: the fallback
    # the DAG model by its state width
    assert heap_families("full", {"model": "dag", "hidden_channels": 8}) == \
        ["dag-narrow", "dag"]
    assert heap_families("full", {"model": "dag", "hidden_channels": 32}) == \
        ["dag-wide", "dag"]
    # GSR by its groups: 4 or more split each layer into many more blocks
    # (GSRGNN's own default, 2, where a row does not say)
    for groups, first in ((None, "gsr-sage"), (2, "gsr-sage"), (3, "gsr-sage"),
                          (4, "gsr-many"), (8, "gsr-many")):
        knobs = {"model": "gsr", "conv": "sage", "num_groups": groups}
        assert heap_families("reversible", knobs) == [first, "gsr"]


def test_time_scales_apply_to_their_family_alone():
    from leangnn.plan.calibration import Calibration

    cal = Calibration("k", "glibc-default", per_op=1e-3, per_byte=0.0, per_flop=0.0,
                      time_scales={"dag": 2.0})
    work = {"ops": 100, "written": 0, "flops": 0}
    assert cal.seconds(work) == pytest.approx(0.1)
    assert cal.seconds(work, ["dag-wide", "dag"]) == pytest.approx(0.2)
    assert cal.seconds(work, ["sage"]) == pytest.approx(0.1)
    # fitted as the median measured / estimated of the family's runs
    cal.time_scales = {}
    runs = [{"work": work, "epoch_seconds": t, "families": ["dag-wide", "dag"]}
            for t in (0.15, 0.3, 0.2)] + [
        {"work": work, "epoch_seconds": 9.0, "families": ["sage"]}]
    cal.fit_time_scales(runs)
    assert cal.time_scales == {"dag": pytest.approx(2.0)}


def _lstsq_factor(runs, const):
    """Reference: the factor f of least relative error of run = big + f heap
    + const over ``runs``, by numpy's least squares on the divided system."""
    a = np.array([[s["heap_bytes"] / s["run_bytes"]] for s in runs])
    y = np.array([(s["run_bytes"] - s["big_bytes"] - const) / s["run_bytes"]
                  for s in runs])
    return float(np.linalg.lstsq(a, y, rcond=None)[0][0])


def test_default_glibc_heap_factor_per_op_mix(monkeypatch):
    # each op mix gets the factor of least relative error over its own runs
    # (every level of heap_families), a run of another mix the largest
    # factor measured
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    const = 8e6
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)[:5]
    samples[0].update(big_bytes=1000.0, heap_bytes=4000.0,
                      run_bytes=5000.0 + const, config={"model": "sage"})
    plan = [({"strategy": "full", "model": "gat"}, 1.3),
            ({"strategy": "full", "model": "res", "conv": "sage"}, 2.0),
            ({"strategy": "full", "model": "res", "conv": "sage"}, 2.2),
            ({"strategy": "full", "model": "res", "conv": "gcn"}, 1.2)]
    for s, (config, factor) in zip(samples[1:], plan):
        s["big_bytes"], s["heap_bytes"] = 4e6, float(64 << 20)
        s["run_bytes"] = s["big_bytes"] + factor * s["heap_bytes"] + const
        s["config"] = config
    cal = fit_calibration(samples, "cpu")
    if cal.allocator != "glibc-default":
        pytest.skip("not a glibc system")
    assert cal.heap_scales["gat"] == pytest.approx(1.3)
    res_sage, res = samples[2:4], samples[2:5]
    assert cal.heap_scales["res-sage"] == pytest.approx(_lstsq_factor(res_sage,
                                                                      const))
    assert 2.0 < cal.heap_scales["res-sage"] < 2.1  # the smaller run weighs more
    assert cal.heap_scales["res"] == pytest.approx(_lstsq_factor(res, const))
    assert cal.heap_scale == pytest.approx(2.2)
    # every run is predicted by its own mix's factor: only the two res-sage
    # runs are off, the 2.2 one by the most
    worst = (2.2 - cal.heap_scales["res-sage"]) * (64 << 20) / samples[3]["run_bytes"]
    assert cal.error["worst"] == pytest.approx(worst, rel=1e-6)

    def run_bytes(knobs, strategy="full"):
        est = Estimate(strategy, knobs, "cpu", step_bytes=3000, big_bytes=1000,
                       heap_bytes=2000)
        cal.apply(est)
        return est.run_bytes

    assert run_bytes({"model": "gat"}) == pytest.approx(1000 + 1.3 * 2000 + const,
                                                        abs=1)
    assert run_bytes({"model": "res", "conv": "gat"}) == pytest.approx(
        1000 + cal.heap_scales["res"] * 2000 + const, abs=1)  # all residual runs
    assert run_bytes({"model": "sage"}, "prune") == pytest.approx(
        1000 + 2.2 * 2000 + const, abs=1)  # nothing like it: the largest
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.heap_scales == cal.heap_scales


def test_first_run_constant_per_op_mix_and_what_a_plan_in_process_paid(
        monkeypatch):
    # tiny runs: a plain model's sets the constant, a deeper op mix's its
    # own (most specific applying, the plain one for the rest); the heap
    # factors are fitted on what each run's own constant leaves; runs planned
    # in their process measure less by what the plan paged in, and fit
    # nothing else
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    plain, gsr, cut = 8e6, 10.5e6, 3.5e6
    base = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)[0]

    def sample(config, heap, factor, const):
        big = 1000.0
        return dict(base, config=config, big_bytes=big, heap_bytes=heap,
                    run_bytes=big + factor * heap + const)

    tiny_sage = {"strategy": "full", "model": "sage", "num_layers": 2}
    tiny_gsr = {"strategy": "reversible", "model": "gsr", "conv": "sage",
                "num_layers": 4}
    samples = [
        sample(tiny_sage, 4000.0, 1.0, plain),
        sample(tiny_gsr, 4000.0, 1.0, gsr),
        sample({**tiny_sage, PLANNED: True}, 4000.0, 1.0, plain - cut),
        sample({**tiny_gsr, PLANNED: True}, 4000.0, 1.0, gsr - cut - 2e5),
        sample({"strategy": "full", "model": "sage", "num_layers": 3},
               float(64 << 20), 1.5, plain),
        sample({"strategy": "reversible", "model": "gsr", "conv": "gcn",
                "num_layers": 8}, float(64 << 20), 1.3, gsr),
    ]
    cal = fit_calibration(samples, "cpu")
    if cal.allocator != "glibc-default":
        pytest.skip("not a glibc system")
    assert cal.const == pytest.approx(plain)
    assert cal.family_consts == pytest.approx({"gsr": gsr, "gsr-sage": gsr})
    assert cal.first_run_const(["gsr-gcn", "gsr"]) == pytest.approx(gsr)
    assert cal.first_run_const(["res-sage", "res"]) == pytest.approx(plain)
    # each heap factor from its own constant: exact
    assert cal.heap_scales["sage"] == pytest.approx(1.5)
    assert cal.heap_scales["gsr-gcn"] == pytest.approx(1.3)
    assert cal.in_process_bytes == pytest.approx(cut + 1e5)  # the median
    assert not any(is_planned(s) for s in samples[4:])

    def run_bytes(c, knobs, strategy):
        est = Estimate(strategy, knobs, "cpu", step_bytes=3000, big_bytes=1000,
                       heap_bytes=2000)
        c.apply(est)
        return est.run_bytes

    gsr_knobs = {"model": "gsr", "conv": "gcn", "num_groups": 2}
    assert run_bytes(cal, gsr_knobs, "reversible") == pytest.approx(
        1000 + 1.3 * 2000 + gsr, abs=1)
    here = cal.in_process()
    assert run_bytes(here, gsr_knobs, "reversible") == pytest.approx(
        1000 + 1.3 * 2000 + gsr - cut - 1e5, abs=1)
    assert here.const == pytest.approx(plain - cut - 1e5)
    assert here.in_process() is here  # paid once
    assert cal.in_process_bytes  # the calibration itself is not changed
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert (back.family_consts, back.in_process_bytes) == (
        cal.family_consts, cal.in_process_bytes)
    # without tiny runs of their own every op mix pays the one constant
    older = Calibration.from_dict({k: v for k, v in cal.to_dict().items()
                                   if k not in ("family_consts", "in_process_bytes")})
    assert older.first_run_const(["gsr-gcn", "gsr"]) == older.const
    assert older.in_process() is older


def test_offload_setup_keeps_a_constant_beyond_its_accounting(monkeypatch):
    # each offload run's setup measured its accounting plus ~3.5 MiB: the
    # need counts the median on top of an offload row's setup (once, however
    # often the calibration is applied), nothing on a row without a setup
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)
    off = [dict(s, work={**s["work"], "jobs": 10, "device_bytes": 1.0,
                         "host_bytes": 1.0},
                run_bytes=0.9 * s["tensor_bytes"], setup_bytes=acc + extra,
                estimated_setup_bytes=acc)
           for s, acc, extra in zip(samples[3:6], (2e6, 9e6, 30e6),
                                    (3.0e6, 3.5e6, 4.9e6))]
    cal = fit_calibration(samples[:3] + off, "cpu")
    assert cal.setup_const == pytest.approx(3.5e6)
    est = Estimate("offload", {"model": "sage"}, "cpu", step_bytes=1000,
                   method="offload-accounting", setup_bytes=5_000_000,
                   work={"ops": 1, "written": 0, "flops": 0, "jobs": 1,
                         "device_bytes": 600, "host_bytes": 400})
    cal.apply(est)
    cal.apply(est)
    assert est.counted_setup_bytes == 5_000_000 + 3_500_000
    assert est.fixed_bytes == est.model_bytes + est.graph_bytes + 8_500_000
    bare = Estimate("full", {"model": "sage"}, "cpu", step_bytes=1000)
    cal.apply(bare)
    assert bare.counted_setup_bytes == 0
    # on CUDA the setup is host memory, not the device's need
    gpu = Estimate("offload", {"model": "sage"}, "cuda", step_bytes=1000,
                   method="offload-accounting", setup_bytes=5_000_000,
                   work=est.work)
    cal.apply(gpu)
    assert gpu.counted_setup_bytes == 0


def test_default_glibc_heap_factor_weighs_runs_by_their_heap_share(monkeypatch):
    # a small run's factor is mostly its process-to-process spread over a
    # few MiB of heap; a large run's heap is most of what it measures: the
    # fitted factor follows the large run (a median would split the two)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    const = 8e6
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)[:3]
    samples[0].update(big_bytes=0.0, heap_bytes=1000.0, run_bytes=1000.0 + const)
    for s, (heap, factor) in zip(samples[1:], ((256 << 20, 1.5), (8 << 20, 2.5))):
        s.update(big_bytes=0.0, heap_bytes=float(heap),
                 run_bytes=factor * heap + const,
                 config={"strategy": "full", "model": "gcn"})
    cal = fit_calibration(samples, "cpu")
    if cal.allocator != "glibc-default":
        pytest.skip("not a glibc system")
    got = cal.heap_scales["gcn"]
    assert got == pytest.approx(_lstsq_factor(samples[1:], const))
    assert 1.5 < got < 1.75  # the median of the two: 2.0


def test_offload_scale_per_model():
    # offload runs of two models keep different shares beside the engine's
    # accounting: each model gets its own scale, others the largest run's
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)
    off = []
    for s, (model, scale) in zip(samples[:3], (("sage", 1.1), ("gcn", 2.8),
                                                ("gcn", 2.6))):
        off.append(dict(s, work={**s["work"], "jobs": 8},
                        run_bytes=scale * s["tensor_bytes"],
                        config={"strategy": "offload", "model": model}))
    cal = fit_calibration(samples[3:] + off)
    # the scale of least relative error over each model's runs (numpy's
    # least squares on the divided system); exact for a model of one run
    def lstsq(runs):
        a = np.array([[s["tensor_bytes"] / s["run_bytes"]] for s in runs])
        y = np.array([(s["run_bytes"] - cal.const) / s["run_bytes"] for s in runs])
        return float(np.linalg.lstsq(a, y, rcond=None)[0][0])

    gcn = lstsq(off[1:])
    assert cal.offload_scales["offload-sage"] == pytest.approx(lstsq(off[:1]))
    assert cal.offload_scales["offload-gcn"] == pytest.approx(gcn)
    assert 2.6 < gcn < 2.8

    def run_bytes(model):
        est = Estimate("offload", {"model": model}, "cpu", step_bytes=1000,
                       method="offload-accounting",
                       work={"ops": 1, "written": 0, "flops": 0, "jobs": 1})
        cal.apply(est)
        return est.run_bytes

    assert run_bytes("sage") == pytest.approx(
        1000 * cal.offload_scales["offload-sage"] + cal.const, abs=1)
    assert run_bytes("gcn") == pytest.approx(1000 * gcn + cal.const, abs=1)
    top = max(off, key=lambda s: s["tensor_bytes"])
    assert run_bytes("gat") == pytest.approx(
        1000 * (top["run_bytes"] - cal.const) / top["tensor_bytes"] + cal.const,
        abs=1)


def test_offload_device_bytes_get_a_term_of_their_own_with_four_runs():
    # measured = 0.8 x step + 1.5 x device bytes + const: the fit recovers
    # both (a one-scale fit cannot: its error on these runs is 20-50%)
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)
    rng = np.random.default_rng(1)
    off = []
    for s in samples[:5]:
        dev = float(rng.uniform(0.1, 2.0)) * s["tensor_bytes"]
        off.append(dict(s, work={**s["work"], "jobs": 8, "device_bytes": dev,
                                 "host_bytes": 0.0},
                        run_bytes=0.8 * s["tensor_bytes"] + 1.5 * dev,
                        config={"strategy": "offload", "model": "sage"}))
    cal = fit_calibration(samples[5:] + off)
    assert cal.offload_scales["offload-sage"] == pytest.approx(0.8, rel=1e-3)
    assert cal.offload_device_scales["offload-sage"] == pytest.approx(1.5, rel=1e-3)
    est = Estimate("offload", {"model": "sage"}, "cpu", step_bytes=1000,
                   method="offload-accounting",
                   work={"ops": 1, "written": 0, "flops": 0, "jobs": 1,
                         "device_bytes": 400})
    cal.apply(est)
    assert est.run_bytes == pytest.approx(800 + 600 + cal.const, abs=2)
    # three runs: one scale, no device term (two coefficients would fit noise)
    cal3 = fit_calibration(samples[5:] + off[:3])
    assert "offload-sage" not in cal3.offload_device_scales


def test_cpu_need_covers_the_process_to_process_spread():
    # runs measured in three processes: the need covers the 90% quantile of
    # highest over median peak; runs measured once leave it at 1
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)
    assert fit_calibration(samples, "cpu").budget_scale == 1.0
    ratios = [1.0, 1.02, 1.05, 1.1, 1.2, 1.3]
    for s, r in zip(samples, ratios):
        s["run_bytes_all"] = [0.9 * s["run_bytes"], s["run_bytes"], r * s["run_bytes"]]
    cal = fit_calibration(samples, "cpu")
    assert cal.budget_scale == pytest.approx(float(np.quantile(ratios, 0.9)))
    assert calibration_label(cal).endswith(f"need = estimate x{cal.budget_scale:.2f}")
    # an estimate under its runs' median: the margin covers the highest
    # process over the estimate, the estimate's error and the spread together
    from leangnn.plan.calibration import _spread_margin

    under = [0.95 * s["run_bytes"] for s in samples]
    assert _spread_margin(samples, under) == pytest.approx(
        float(np.quantile([r / 0.95 for r in ratios], 0.9)))
    # and the plan's need is the estimate times it
    from leangnn.plan.planner import estimate_row

    est = Estimate("full", {}, "cpu", step_bytes=1000, model_bytes=0, graph_bytes=0)
    cal.apply(est)
    row = estimate_row("full", est, cal, "exact", {"strategy": "full"})
    assert row.need_bytes == math.ceil(est.peak_bytes * cal.budget_scale)


def test_long_runs_scale_the_need_of_runs_longer_than_the_calibration():
    from leangnn.plan.calibration import (
        SHORT_RUN_EPOCHS,
        fit_long_runs,
        long_run_families,
    )
    from leangnn.plan.planner import estimate_row

    mib = 1 << 20
    runs = [  # peaks after each epoch: creeping (gsr), flat (sage), too short
        {"families": long_run_families("reversible", {"model": "gsr"}),
         "epoch_peak_bytes": [30 * mib, 33 * mib, 33 * mib, 35 * mib, 43 * mib,
                              40 * mib]},
        {"families": long_run_families("reversible", {"model": "gsr"}),
         "epoch_peak_bytes": [30 * mib, 30 * mib, 30 * mib, 33 * mib]},
        {"families": long_run_families("reversible", {"model": "gsr"}),
         "epoch_peak_bytes": [20 * mib, 20 * mib, 20 * mib, 20 * mib]},
        {"families": long_run_families("full", {"model": "sage"}),
         "epoch_peak_bytes": [20 * mib, 20 * mib, 21 * mib, 21 * mib, 22 * mib]},
        {"families": long_run_families("offload", {"model": "sage"}),
         "epoch_peak_bytes": [10 * mib, 11 * mib, None, 12 * mib, 12 * mib]},
        {"families": ["gcn"], "epoch_peak_bytes": [5 * mib] * SHORT_RUN_EPOCHS},
    ]
    cal = Calibration("test", "glibc-default", calibrated=True, budget_scale=1.1)
    scales = fit_long_runs(cal, runs)
    # the median of how much higher a family's runs peak than over their
    # first three epochs (None: not recorded)
    assert scales["gsr-sage"] == scales["gsr"] == pytest.approx(1.1)
    assert scales["sage"] == pytest.approx(22 / 21)
    assert scales["offload-sage"] == pytest.approx(12 / 11)
    assert "gcn" not in scales and "offload-gcn" not in scales
    assert scales["*"] == pytest.approx(float(np.median(
        [43 / 33, 1.1, 1.0, 22 / 21, 12 / 11])))
    assert cal.long_run_epochs == 6
    gsr = long_run_families("reversible", {"model": "gsr", "conv": "sage"})
    assert gsr == ["gsr-sage", "gsr"]
    assert cal.long_run_scale(gsr, SHORT_RUN_EPOCHS) == 1.0  # as calibrated
    assert cal.long_run_scale(gsr, 60) == pytest.approx(1.1)
    assert cal.long_run_scale(gsr, None) == pytest.approx(1.1)  # unknown: long
    assert cal.long_run_scale(["gcn"], 60) == scales["*"]  # not measured: all runs
    assert Calibration("t", "glibc-default").long_run_scale(gsr, 60) == 1.0
    assert "x1.05-1.10 more for runs over 3 epochs" in calibration_label(cal)
    # the plan's need for a long run carries it; a 3-epoch run's does not
    need = {}
    for epochs in (3, 60):
        est = Estimate("reversible", {"model": "gsr", "conv": "sage"}, "cpu",
                       step_bytes=1000)
        cal.apply(est)
        need[epochs] = estimate_row("reversible", est, cal, "exact", {},
                                    epochs).need_bytes
    assert need[3] == math.ceil(1000 * 1.1)
    assert need[60] == math.ceil(1000 * 1.1 * 1.1)
    # it travels with the stored calibration; older files load without it
    again = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again.long_run_scales == scales and again.long_run_epochs == 6
    old = {k: v for k, v in cal.to_dict().items() if not k.startswith("long_run")}
    assert Calibration.from_dict(old).long_run_scale(gsr, 60) == 1.0
    with pytest.raises(ValueError, match="no run longer than 3 epochs"):
        fit_long_runs(cal, runs[5:])


def test_reference_calibration_when_nothing_is_stored(tmp_path, monkeypatch):
    from leangnn.plan import calibration as C

    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    ref = tmp_path / "reference"
    monkeypatch.setattr(C, "REFERENCE_DIR", ref)
    # nothing shipped for this allocator mode: the defaults
    assert not load_calibration("cpu").calibrated
    shipped = fit_calibration(_samples(1.3, 0.0, 1e-5, 1e-9, 1e-10))
    shipped.kind = "cpu-reference-box"
    ref.mkdir()
    (ref / f"{allocator_mode('cpu')}.json").write_text(
        json.dumps(shipped.to_dict()))
    got = load_calibration("cpu")
    assert got.calibrated and got.scale == pytest.approx(shipped.scale)
    assert got.reference.startswith("cpu-reference-box")
    assert C.calibration_label(got) == "reference cpu-reference-box"
    est = Estimate("full", {}, "cpu", step_bytes=100, model_bytes=7, graph_bytes=3,
                   work={"ops": 4, "written": 0, "flops": 0})
    got.apply(est)
    assert "reference calibration" in est.note and "leangnn.plan.calibrate" in est.note
    # the off switch, and a calibration measured here wins over the reference
    assert not load_calibration("cpu", reference=False).calibrated
    mine = fit_calibration(_samples(1.1, 0.0, 1e-5, 1e-9, 1e-10))
    mine.save()
    back = load_calibration("cpu")
    assert back.reference == "" and back.scale == pytest.approx(mine.scale)
    assert C.calibration_label(back) == back.kind
    # a damaged reference is ignored (defaults), never a crash
    (tmp_path / "calibration" / f"{machine_kind('cpu')}.json").unlink()
    (ref / f"{allocator_mode('cpu')}.json").write_text("{not json")
    assert not load_calibration("cpu").calibrated


def test_shipped_reference_calibrations_load():
    from leangnn.plan.calibration import REFERENCE_DIR, Calibration

    files = sorted(REFERENCE_DIR.glob("*.json"))
    assert files, f"no reference calibration in {REFERENCE_DIR}"
    for f in files:
        cal = Calibration.from_dict(json.loads(f.read_text()))
        assert cal.calibrated and cal.allocator == f.stem and cal.reference
        assert cal.samples == []  # shipped without the measurements
        assert cal.scale > 0 and cal.const >= 0


def _offload_runs(samples, seed, model, mapped=lambda i: 0.0):
    """Offload runs measuring 1.2 x the step's heap part (less ``mapped(i)``
    of it, resident as it is) + 2.5 x a job's edge-sized bytes."""
    rng = np.random.default_rng(seed)
    off = []
    for i, s in enumerate(samples):
        edge = float(rng.uniform(0.0, 1.5)) * s["tensor_bytes"]
        apart = mapped(i) * s["tensor_bytes"]
        off.append(dict(s, work={**s["work"], "jobs": 8, "device_bytes": 1.0,
                                 "host_bytes": 0.0, "edge_job_bytes": edge,
                                 "mapped_bytes": apart},
                        run_bytes=1.2 * (s["tensor_bytes"] - apart) + apart
                        + 2.5 * edge,
                        config={"strategy": "offload", "model": model(i)}))
    return off


def test_offload_job_edge_bytes_get_a_term_and_a_pooled_fit():
    # measured = 1.2 x step + 2.5 x a job's edge-sized bytes + const (dense
    # graphs' E_c x C blocks fragment the heap): the fit recovers both, per
    # model and pooled for a model without runs of its own
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)
    off = _offload_runs(samples[:6], 2, lambda i: "sage" if i % 2 else "gcn")
    cal = fit_calibration(samples[6:] + off)
    # three runs each: one scale per model; six pooled: both terms
    assert set(cal.offload_edge_scales) == {"offload"}
    assert cal.offload_scales["offload"] == pytest.approx(1.2, rel=1e-3)
    assert cal.offload_edge_scales["offload"] == pytest.approx(2.5, rel=1e-3)
    assert not cal.offload_device_scales
    four = fit_calibration(samples[6:] + off + [
        dict(o, config={**o["config"], "model": "gcn"}) for o in off[1::2]])
    assert four.offload_edge_scales["offload-gcn"] == pytest.approx(2.5, rel=1e-3)
    for model in ("gat", "gcn"):  # pooled, and a model with 3 runs: one scale
        est = Estimate("offload", {"model": model}, "cpu", step_bytes=1000,
                       method="offload-accounting",
                       work={"ops": 1, "written": 0, "flops": 0, "jobs": 1,
                             "edge_job_bytes": 400})
        cal.apply(est)
        if model == "gat":
            assert est.run_bytes == pytest.approx(1200 + 1000 + cal.const, abs=2)
        else:
            assert est.run_bytes == pytest.approx(
                1000 * cal.offload_scales["offload-gcn"] + cal.const, abs=2)


def test_offload_blocks_mapped_apart_are_counted_once_not_scaled():
    # measured = 1.2 x (step - mapped) + mapped + 2.5 x heap edge bytes:
    # runs with blocks past glibc's mmap threshold fit the same scales, and
    # the estimate adds the mapped bytes as they are
    samples = _samples(1.0, 0.0, 2e-5, 1e-9, 3e-10)
    off = _offload_runs(samples[:6], 3, lambda i: "sage",
                        mapped=lambda i: 0.3 if i % 2 else 0.0)
    cal = fit_calibration(samples[6:] + off)
    assert cal.offload_scales["offload-sage"] == pytest.approx(1.2, rel=1e-3)
    assert cal.offload_edge_scales["offload-sage"] == pytest.approx(2.5, rel=1e-3)
    work = {"ops": 1, "written": 0, "flops": 0, "jobs": 1, "edge_job_bytes": 400}
    est = Estimate("offload", {"model": "sage"}, "cpu", step_bytes=1000,
                   method="offload-accounting", work={**work, "mapped_bytes": 300})
    cal.apply(est)
    assert est.run_bytes == pytest.approx(1.2 * 700 + 300 + 2.5 * 400 + cal.const,
                                          abs=2)


def test_heap_factor_splits_by_the_edge_sized_share_of_the_heap():
    # measured = big + (2.2 x node-sized + 1.4 x edge-sized heap) + const:
    # the fit recovers both where the runs' shares spread; a finer op mix
    # with three runs takes its parent's split, scaled to its runs; samples
    # without shares (older ones) get one factor
    from leangnn.plan.calibration import family_heap_factors, fit_heap_families

    rng = np.random.default_rng(3)
    runs = []
    for i in range(6):
        heap, big, s = float(rng.uniform(2e7, 2e8)), float(rng.uniform(0, 1e7)), \
            [0.05, 0.1, 0.2, 0.5, 0.7, 0.8][i]
        k = 1.1 if i % 2 else 1.0  # the finer mix fragments 10% more
        runs.append({"heap_bytes": heap, "big_bytes": big, "heap_edge_share": s,
                     "run_bytes": big + k * heap * ((1 - s) * 2.2 + s * 1.4) + 5e6,
                     "fine": bool(i % 2)})
    node, edge = family_heap_factors([r for r in runs if not r["fine"]], 5e6)
    assert edge is None  # three runs: one factor
    scales, edges = fit_heap_families(
        {"gsr": [r for r in runs if not r["fine"]] * 2,  # 6 runs, spread 0.65
         "gsr-sage": [r for r in runs if r["fine"]]}, 5e6)
    assert (scales["gsr"], edges["gsr"]) == pytest.approx((2.2, 1.4), rel=1e-3)
    assert (scales["gsr-sage"], edges["gsr-sage"]) == pytest.approx(
        (2.42, 1.54), rel=1e-3)
    old = [{k: v for k, v in r.items() if k != "heap_edge_share"} for r in runs]
    assert family_heap_factors(old, 5e6)[1] is None
    # applied: the factor is the share-weighted mean of the two
    cal = Calibration("t", "glibc-default", heap_scale=3.0, calibrated=True,
                      heap_scales=scales, heap_edge_scales=edges)
    assert cal.heap_factor(["gsr-sage", "gsr"], 0.25) == pytest.approx(
        0.75 * 2.42 + 0.25 * 1.54, rel=1e-3)
    assert cal.heap_factor(["gat"], 0.25) == 3.0


def test_a_partial_refit_is_stamped_beside_the_measurement():
    # a reference refitted by --time-only or --family says so, not only
    # when the whole calibration was measured
    cal = fit_calibration(_samples(1.3, 5e6, 2e-5, 1e-9, 3e-10))
    assert cal.refitted == {} and cal.origin() == f"{cal.kind}, {cal.measured_at}"
    cal.stamp("time")
    cal.stamp("heap gsr")
    assert set(cal.refitted) == {"time", "heap gsr"}
    assert cal.origin().startswith(f"{cal.kind}, {cal.measured_at} (refitted: ")
    assert "heap gsr " in cal.origin() and "time " in cal.origin()
    back = Calibration.from_dict(cal.to_dict())
    assert back.refitted == cal.refitted
    # an older file without the field loads with nothing refitted
    old = {k: v for k, v in cal.to_dict().items() if k != "refitted"}
    assert Calibration.from_dict(old).refitted == {}
    # measured as a whole again: the stamps go
    assert fit_calibration(_samples(1.3, 5e6, 2e-5, 1e-9, 3e-10)).refitted == {}


def test_the_compact_heap_is_an_allocator_mode_of_its_own(monkeypatch):
    from leangnn.heap import compact_heap_env

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    default = machine_kind("cpu")
    monkeypatch.setenv("GLIBC_TUNABLES", compact_heap_env({})["GLIBC_TUNABLES"])
    if allocator_mode("cpu") == "system":
        return  # (not Linux: one mode)
    assert allocator_mode("cpu") == "glibc-compact"
    assert machine_kind("cpu") == default.replace("glibc-default", "glibc-compact")


def test_a_pick_on_dprs_core_has_its_own_in_process_share():
    """A plan made in the process that trains DPR's core pages in less of
    that run's code (the core's sparse products, DPR's serving) than of an
    exact row's: its first-run constants (``prune`` op mixes) lose the core's
    share, the others the exact one; unmeasured, the core's is the exact."""
    cal = Calibration("test", "glibc-default", const=8e6, in_process_bytes=3.5e6,
                      in_process_core_bytes=2.7e6,
                      family_consts={"gsr": 10e6, "prune": 7.5e6,
                                     "prune-res": 7.6e6})
    assert cal.in_process_share("prune") == 2.7e6
    assert cal.in_process_share("full") == cal.in_process_share() == 3.5e6
    here = cal.in_process()
    assert here.const == pytest.approx(4.5e6)
    assert here.family_consts == pytest.approx(
        {"gsr": 6.5e6, "prune": 4.8e6, "prune-res": 4.9e6})
    assert here.first_run_const(["prune-gsr", "prune"]) == pytest.approx(4.8e6)
    assert here.in_process() is here  # paid once
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.in_process_core_bytes == 2.7e6
    for bad, why in ((-1.0, "bytes >= 0"), (float("nan"), "finite"),
                     ("2MiB", "a number")):  # a damaged file, named
        with pytest.raises(ValueError, match=f"'in_process_core_bytes'.*{why}"):
            Calibration.from_dict({**cal.to_dict(), "in_process_core_bytes": bad})
    # not measured: the exact share for every op mix
    old = Calibration("test", "glibc-default", const=8e6, in_process_bytes=3.5e6,
                      family_consts={"prune": 7.5e6})
    assert old.in_process_share("prune") == 3.5e6
    assert old.in_process().family_consts == pytest.approx({"prune": 4.0e6})
    # the table records the pick's share (resumed_plan gives it back)
    from leangnn.plan.planner import PlanRow, in_process_share

    core = PlanRow("prune", {}, "approximate", config={"strategy": "prune",
                                                        "budget_ratio": 0.5})
    edges = PlanRow("prune", {}, "approximate", config={
        "strategy": "prune", "budget_ratio": 0.5, "sparse_adj": False})
    full = PlanRow("full", {}, "exact", config={"strategy": "full"})
    assert in_process_share(cal, core) == 2_700_000
    assert in_process_share(cal, edges) == in_process_share(cal, full) == 3_500_000
    assert in_process_share(cal, None) == 3_500_000


def test_a_machines_own_calibration_takes_the_references_core_ratio():
    from leangnn.plan.calibrate import core_share

    ref = Calibration("ref", "glibc-default", in_process_bytes=4e6,
                      in_process_core_bytes=3e6)
    mine = Calibration("mine", "glibc-default", in_process_bytes=2e6)
    core_share(mine, ref)
    assert mine.in_process_core_bytes == pytest.approx(1.5e6)
    assert "in process, DPR core" in " ".join(mine.refitted)
    for other in (None, Calibration("ref", "glibc-default", in_process_bytes=4e6)):
        left = Calibration("mine", "glibc-default", in_process_bytes=2e6)
        core_share(left, other)  # nothing to scale by: the exact share stays
        assert left.in_process_core_bytes is None
        assert left.in_process_share("prune") == 2e6
