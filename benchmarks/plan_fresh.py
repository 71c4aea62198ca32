"""`--strategy auto` on circuits and budgets the planner was never fitted on.

    python benchmarks/plan_fresh.py [--repeat 2]   # results/plan_fresh.{json,md}
    python benchmarks/plan_fresh.py --epochs 20 --with-cli-auto
                                    # results/plan_long.{json,md}: long runs
    python benchmarks/plan_fresh.py --set unseen --budget-fraction 0.6
                                    # results/plan_unseen.{json,md}

Six ``leangnn train --strategy auto --memory-budget B`` command lines, each on
a graph that neither the calibration nor the ``cli`` section of
``benchmarks/plan.py`` trains on (epfl/memctrl, epfl/sqrt, misc/banyan_256,
epfl/arbiter, itc99/b22, csbm:60000) and with a budget below what full batch
needs, run in fresh interpreters (glibc's default heap, one intra-op thread)
as the ``cli`` section runs its rows. The check is the user's: no process's
measured peak above its budget; beside it the estimate's error and the
epoch time estimated and measured (the time model reads about 2x low on
graphs of this size: see the planner's misses in ``benchmarks/README.md``).
Run it alone: a second process on a 2-core machine slows both.

``--device cuda --budget-fraction 0.6 --out results/gpu/plan_fresh.json`` is
the GPU check (``benchmarks/gpu_check.sh``): the same command lines on CUDA,
each budget made FRACTION of what full batch needs there (``leangnn plan
--json``'s full row on that device), since the CPU budgets count a process's
whole resident memory and a CUDA budget only the device's allocations.

``--epochs 20 --with-cli-auto`` is the long-run check: the same cases and the
``--strategy auto`` rows of the ``cli`` section trained for 20 epochs instead
of 3 (a run's peak can still creep up after its third epoch: glibc's heap).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _report import results_path, write_json, write_section  # noqa: E402
from plan import _cli_measure  # noqa: E402  (one way to run a command line)

_V = "--val-dataset iscas85/c17 --test-dataset iscas85/c432"
#: (name, command line after ``train``, memory budget)
FRESH = [
    ("memctrl-sage3", f"--dataset epfl/memctrl {_V} --model sage --layers 3 "
     "--hidden 64", "250MiB"),
    ("sqrt-res8", f"--dataset epfl/sqrt {_V} --model res --layers 8 --hidden 32",
     "100MiB"),
    ("banyan256-gcn3", f"--dataset misc/banyan_256 {_V} --model gcn --layers 3 "
     "--hidden 64", "100MiB"),
    ("arbiter-gat2", f"--dataset epfl/arbiter {_V} --model gat --layers 2 "
     "--hidden 32", "48MiB"),
    ("b22-gsr16", f"--dataset itc99/b22 {_V} --model gsr --layers 16 --hidden 32",
     "45MiB"),
    ("csbm60k-gcn2", "--dataset csbm:60000 --model gcn --layers 2 --hidden 32",
     "120MiB"),
]

#: ``--set unseen`` (stop 41): graphs, sizes and model settings that no
#: calibration run, no ``cli`` row and none of the cases above use; their
#: budgets are ``--budget-fraction`` of full batch's estimated need
UNSEEN = [
    ("b20-sage4", f"--dataset itc99/b20 {_V} --model sage --layers 4 --hidden 64"),
    ("max-gat3", f"--dataset epfl/max {_V} --model gat --layers 3 --hidden 32"),
    ("banyan128-res12-gcn", f"--dataset misc/banyan_128 {_V} --model res --conv gcn "
     "--layers 12 --hidden 32"),
    ("banyan128-gin3", f"--dataset misc/banyan_128 {_V} --model gin --layers 3 "
     "--hidden 64"),
    ("csbm150k-sage2", "--dataset csbm:150000 --model sage --layers 2 --hidden 32"),
    ("max-gsr24", f"--dataset epfl/max {_V} --model gsr --layers 24 --hidden 32 "
     "--groups 2"),
]


#: ``--set tight`` (stop 42): more graphs and settings none of the above use,
#: each budget cut to what the planner says its pick needs (see :func:`run`)
TIGHT = [
    ("square-sage3", f"--dataset epfl/square {_V} --model sage --layers 3 "
     "--hidden 64"),
    ("adder-gcn4", f"--dataset epfl/adder {_V} --model gcn --layers 4 --hidden 32"),
    ("s38417-res6", f"--dataset iscas89/s38417 {_V} --model res --conv sage "
     "--layers 6 --hidden 32"),
    ("bar-gat2", f"--dataset epfl/bar {_V} --model gat --layers 2 --hidden 64"),
    ("banyan64-gsr16", f"--dataset misc/banyan_64 {_V} --model gsr --layers 16 "
     "--hidden 32 --groups 4"),
    ("csbm80k-gcn3", "--dataset csbm:80000 --model gcn --layers 3 --hidden 64"),
    ("b18-gsr8-gat", f"--dataset itc99/b18 {_V} --model gsr --conv gat --layers 8 "
     "--hidden 16 --groups 2"),
    ("voter-res6-gcn", f"--dataset epfl/voter {_V} --model res --conv gcn "
     "--layers 6 --hidden 32"),
    ("log2-gin3", f"--dataset epfl/log2 {_V} --model gin --layers 3 --hidden 64"),
    ("b17-b20-sage3", f"--dataset itc99/b17,itc99/b20 {_V} --model sage --layers 3 "
     "--hidden 32"),
]


def cases(with_cli_auto: bool = False, unseen: bool = False, tight: bool = False
          ) -> list[tuple[str, str, str]]:
    """(name, command line after ``train``, budget) of each case (``unseen``
    or ``tight``: :data:`UNSEEN`'s or :data:`TIGHT`'s, whose budget ``FULL``
    the fraction replaces)."""
    if unseen or tight:
        return [(name, f"{args} --strategy auto --memory-budget FULL", "FULL")
                for name, args in (TIGHT if tight else UNSEEN)]
    out = [(name, f"{args} --strategy auto --memory-budget {budget}", budget)
           for name, args, budget in FRESH]
    if with_cli_auto:
        from plan import CLI_ROWS  # the held-out rows included

        for row in CLI_ROWS:
            argv = row["args"].split()
            if "auto" in argv:
                out.append((row["name"], row["args"],
                            argv[argv.index("--memory-budget") + 1]))
    return out


def full_need(args: str, device: str, timeout: float) -> int:
    """What full batch needs for the command line ``args`` on ``device``:
    ``leangnn plan --json``'s full (or reversible) row, run in a fresh
    interpreter."""
    import json
    import shlex
    import subprocess

    argv = shlex.split(args)
    for opt in ("--memory-budget", "--strategy"):  # the plan lists every one
        i = argv.index(opt)
        del argv[i:i + 2]
    p = subprocess.run([sys.executable, "-m", "leangnn", "plan", *argv, "--device",
                        device, "--memory-budget", "64GiB", "--json"],
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError((p.stderr.strip().splitlines() or ["?"])[-1])
    rows = json.loads(p.stdout)["rows"]
    # (a GSR model's whole-graph row is its reversible training)
    return next(r["need_bytes"] for r in rows
                if r["strategy"] in ("full", "reversible"))


def run(repeat: int, timeout: float, epochs: int = 3,
        with_cli_auto: bool = False, device: str = "cpu",
        budget_fraction: float | None = None, only: list[str] | None = None,
        unseen: bool = False, tight: bool = False) -> dict:
    """Every case's runs. ``tight``: the budget (FRACTION of full batch's
    need) is then cut to the need the planner estimates for its pick there
    (one run's ``budget_check``, rounded up to 0.1 MiB; a run of as many
    epochs, since a plan's need grows with them on CPU), so the pick
    fits with nothing to spare: a run over it is an under-estimate the
    planner's margin did not absorb."""
    from leangnn.utils import format_bytes, parse_bytes

    rows = []
    for name, args, budget in cases(with_cli_auto, unseen, tight):
        if only and not any(s in name for s in only):
            continue
        if device != "cpu":
            args = f"{args} --device {device}"
        if budget_fraction is not None:
            try:
                need = full_need(args, device, timeout)
            except (RuntimeError, StopIteration) as e:
                rows.append({"name": name, "budget": budget, "error": str(e) or
                             "leangnn plan --json listed no full or reversible "
                             "row"})
                continue
            new = format_bytes(int(need * budget_fraction)).replace(" ", "")
            args = args.replace(f"--memory-budget {budget}", f"--memory-budget {new}")
            budget = new
        first = None
        if tight:
            first = _cli_measure({"args": args}, epochs, 1, timeout)
            if "error" in first or not first.get("budget_check"):
                rows.append({"name": name, "budget": budget, "error": first.get(
                    "error", "summary.json has no budget_check")})
                continue
            tenths = -(-first["budget_check"]["estimated_need_bytes"] * 10 // 2**20)
            new = f"{tenths / 10}MiB"
            args = args.replace(f"--memory-budget {budget}", f"--memory-budget {new}")
            first = {"budget": budget, "pick": first["plan"]["pick"],
                     "need_bytes": first["budget_check"]["measured_need_bytes"]}
            budget = new
        row = {"args": args}
        runs = [_cli_measure(row, epochs, 1, timeout) for _ in range(repeat)]
        bad = [r["error"] for r in runs if "error" in r]
        if bad:
            rows.append({"name": name, "budget": budget, "error": bad[0]})
            continue
        peaks = [r["peak_bytes"] for r in runs]
        plan = runs[0]["plan"]
        est = plan["estimated_run_bytes"]
        med = statistics.median(peaks)
        # each process's need as the planner counts it (its peak, the model,
        # the graph and the setup's resident state: summary.json's
        # budget_check), else its peak alone
        needs = [r["budget_check"]["measured_need_bytes"] if r.get("budget_check")
                 else r["peak_bytes"] for r in runs]
        rows.append({
            "name": name, "args": row["args"], "budget": budget,
            "budget_bytes": parse_bytes(budget), "picks": [r["plan"]["pick"]
                                                           for r in runs],
            "estimated_run_bytes": est, "peaks": peaks, "needs": needs,
            "within_budget": all(n <= parse_bytes(budget) for n in needs),
            **({"first": first} if first else {}),
            "error": (est - med) / med,
            "estimated_epoch_seconds": plan["estimated_epoch_seconds"],
            "epoch_seconds": statistics.median(
                r["epoch_seconds_median"] for r in runs)})
        print(f"plan_fresh: {name}: {rows[-1]['picks'][0]}, peaks "
              f"{[round(p / 2**20, 1) for p in peaks]} MiB of {budget}, "
              f"error {rows[-1]['error']:+.1%}", file=sys.stderr)
    return {"date": time.strftime("%Y-%m-%d"), "repeat": repeat, "epochs": epochs,
            "with_cli_auto": with_cli_auto, "device": device,
            "budget_fraction": budget_fraction, "unseen": unseen, "tight": tight,
            "rows": rows}


def markdown(res: dict) -> str:
    mib = 2.0 ** 20
    ok = [r for r in res["rows"] if "peaks" in r]
    n_in = sum(sum(p <= r["budget_bytes"] for p in r.get("needs", r["peaks"]))
               for r in ok)
    n = sum(len(r["peaks"]) for r in ok)
    errs = sorted(abs(r["error"]) for r in ok)
    epochs = res.get("epochs", 3)
    flags = f" --epochs {epochs}" if epochs != 3 else ""
    flags += " --with-cli-auto" if res.get("with_cli_auto") else ""
    frac = res.get("budget_fraction")
    if res.get("device", "cpu") != "cpu":
        flags += f" --device {res['device']}"
    if frac is not None:
        flags += f" --budget-fraction {frac}"
    if res.get("unseen"):
        flags += " --set unseen"
    if res.get("tight"):
        flags += " --set tight"
    what = ("graphs no calibration run or `cli` row trains on, a budget "
            + (f"of {frac} x full batch's estimated need" if frac is not None
               else "below full batch's need"))
    if res.get("with_cli_auto"):
        what += ", and the `--strategy auto` rows of the `cli` section"
    if res.get("tight"):
        what += (", then cut to the need the plan estimates for its pick there "
                 "(nothing to spare; the first budget and pick in the JSON)")
    out = [f"`python benchmarks/plan_fresh.py --repeat {res['repeat']}{flags}` "
           f"({res['date']}; {what}; {epochs} epochs per run): "
           f"**{n_in} of {n} processes within their budget** (a process's "
           "need: its peak above the loaded state plus the model, the graph and "
           "what the strategy's setup keeps, as `budget_check` in summary.json "
           "counts it)" + (
               f"; memory error median {statistics.median(errs):.1%}, worst "
               f"{errs[-1]:.1%}." if errs else "."), "",
           "| case | budget | pick | estimated | measured | error | need "
           "| est. epoch s | epoch s |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        if "peaks" not in r:
            out.append(f"| {r['name']} | {r['budget']} | failed: {r['error']} "
                       "| | | | | | |")
            continue
        peaks = ", ".join(f"{p / mib:.1f}" for p in r["peaks"])
        needs = ", ".join(f"{p / mib:.1f}" for p in r.get("needs", []))
        out.append(f"| {r['name']} | {r['budget']} | {r['picks'][0]} | "
                   f"{r['estimated_run_bytes'] / mib:.1f} MiB | {peaks} MiB | "
                   f"{r['error']:+.1%} | {needs + ' MiB' if needs else 'n/a'} | "
                   f"{r['estimated_epoch_seconds']:.3f} | {r['epoch_seconds']:.3f} |")
    return "\n".join(out)


def _merged(res: dict, path: Path, names: list[str]) -> dict:
    """``res`` (the ``--only`` cases) with the other cases of the same check
    already in ``path`` kept, in case order: a rerun of one case must not
    drop the rest of the table."""
    import json

    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return res
    # (``or False``: results written before a key existed lack it)
    same = all((old.get(k) or False) == (res.get(k) or False)
               for k in ("epochs", "with_cli_auto", "device", "budget_fraction",
                         "repeat", "unseen", "tight"))
    if not same:
        return res
    ran = {r["name"] for r in res["rows"]}
    rows = [r for r in old.get("rows", []) if r.get("name") not in ran] + res["rows"]
    order = {n: i for i, n in enumerate(names)}
    rows.sort(key=lambda r: order.get(r.get("name"), len(order)))
    return {**res, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2,
                    help="fresh processes per command line (default: 2)")
    ap.add_argument("--epochs", type=int, default=3,
                    help="epochs per run (default: 3, as the cli section)")
    ap.add_argument("--with-cli-auto", action="store_true",
                    help="also the --strategy auto rows of plan.py's cli section")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:i: "
                    "added to every command line (default: cpu)")
    ap.add_argument("--budget-fraction", type=float, default=None,
                    metavar="FRACTION", help="each budget FRACTION x full "
                    "batch's estimated need on --device (default: the fixed "
                    "CPU budgets)")
    ap.add_argument("--set", choices=("fresh", "unseen", "tight"), default="fresh",
                    help="the cases: FRESH's fixed budgets, UNSEEN's (stop 41; "
                    "needs --budget-fraction) or TIGHT's (stop 42; needs "
                    "--budget-fraction, then cut to the pick's estimated need) "
                    "(default: fresh)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="case names (or substrings) to run")
    ap.add_argument("--out", default=None, help="the JSON (and its .md beside "
                    "it); given, benchmarks/README.md is left alone")
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.repeat < 1:
        ap.error(f"--epochs and --repeat must be >= 1, got {args.epochs} and "
                 f"{args.repeat}")
    if args.budget_fraction is not None and not 0 < args.budget_fraction < 1:
        ap.error(f"--budget-fraction must be in (0, 1), got {args.budget_fraction}")
    unseen, tight = args.set == "unseen", args.set == "tight"
    if (unseen or tight) and (args.budget_fraction is None or args.with_cli_auto):
        ap.error(f"--set {args.set}: needs --budget-fraction (its cases have no "
                 "fixed budget) and no --with-cli-auto")
    names = [name for name, _, _ in cases(args.with_cli_auto, unseen, tight)]
    if args.only is not None and not any(s in n for s in args.only for n in names):
        ap.error(f"--only: no case matches {args.only}; the cases: {', '.join(names)}")
    res = run(args.repeat, args.timeout, args.epochs, args.with_cli_auto,
              args.device, args.budget_fraction, args.only, unseen, tight)
    # the default check keeps its name; a long or wider one is its own section
    name = "plan-fresh" if args.epochs == 3 and not args.with_cli_auto else \
        "plan-long"
    if unseen or tight:
        name = f"plan-{args.set}"
    out = Path(args.out) if args.out else results_path(name.replace("-", "_")
                                                       + ".json")
    if args.only:
        res = _merged(res, out, names)
    path = write_json(out, res)
    md = markdown(res)
    write_section(name, md, path.with_suffix(".md"))
    if not args.out:
        write_section(name, md)
    print(f"plan_fresh: wrote {path}" + ("" if args.out else f" and the {name} "
          "section of benchmarks/README.md"), file=sys.stderr)
    failed = [r["name"] for r in res["rows"] if "peaks" not in r]
    if failed:  # a failed case is a failed check, not a row to skim past
        print(f"plan_fresh: {len(failed)} of {len(res['rows'])} cases failed: "
              f"{', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
