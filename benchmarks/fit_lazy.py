"""`leangnn.fit` planning only what its pick needs, against every row (stop 43).

    python benchmarks/fit_lazy.py [--rounds 3]      # results/fit_lazy.json

Since stop 43 ``leangnn.fit`` plans lazily, as ``leangnn train --strategy
auto`` does: no DPR core is built or estimated where an exact row fits, and
no core smaller than the largest that fits; ``fit(lazy=False)`` estimates
every row. Each case runs ``fit`` (GraphSAGE-3, 64 hidden, 3 epochs; the
child of ``fit_reuse.py``) in a fresh interpreter with one OpenMP thread,
alternating lazy and every row, ``--rounds`` times each; the report has the
medians of the whole call's wall time and of the plan's seconds, the picks
and whether the losses are equal.
"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from fit_reuse import alternated, cli, once  # noqa: E402

#: (name, csbm nodes, strategy, memory budget)
CASES = [("csbm20k-auto", 20_000, "auto", "4GiB"),
         ("csbm100k-auto", 100_000, "auto", "4GiB"),
         ("csbm100k-prune", 100_000, "prune", "4GiB")]


def run(rounds: int) -> dict:
    rows = []
    for name, n, strategy, budget in CASES:
        # (``once``'s last argument: lazy, reuse on)
        runs, med, equal = alternated(rounds, partial(once, n, strategy, budget, True))
        rows.append({"name": name, "rounds": rounds,
                     "row_lazy": runs[True][0]["row"], "row_all": runs[False][0]["row"],
                     "wall_lazy": med[True]["wall"], "wall_all": med[False]["wall"],
                     "plan_lazy": med[True]["plan"], "plan_all": med[False]["plan"],
                     "losses_equal": equal})
        print(f"fit_lazy: {name}: plan {med[True]['plan']:.2f} s lazy, "
              f"{med[False]['plan']:.2f} s every row", file=sys.stderr)
    return {"date": time.strftime("%Y-%m-%d"), "rows": rows}


def markdown(res: dict) -> str:
    out = [f"`python benchmarks/fit_lazy.py --rounds {res['rows'][0]['rounds']}` "
           f"({res['date']}; `leangnn.fit`, GraphSAGE-3 h64, 3 epochs, one thread, "
           "medians; lazy against `lazy=False`):", "",
           "| case | pick (lazy; every row) | plan s, lazy / every row | ratio "
           "| fit wall s, lazy / every row | ratio | losses equal |",
           "|---|---|---:|---:|---:|---:|---|"]
    for r in res["rows"]:
        pick = r["row_lazy"] if r["row_lazy"] == r["row_all"] else \
            f"{r['row_lazy']}; {r['row_all']}"
        out.append(f"| {r['name']} | {pick} | {r['plan_lazy']:.2f} / "
                   f"{r['plan_all']:.2f} | {r['plan_lazy'] / r['plan_all']:.2f} | "
                   f"{r['wall_lazy']:.2f} / {r['wall_all']:.2f} | "
                   f"{r['wall_lazy'] / r['wall_all']:.2f} | "
                   f"{'yes' if r['losses_equal'] else 'NO'} |")
    return "\n".join(out)


def main(argv=None) -> None:
    cli("fit_lazy", __doc__, run, markdown, argv)


if __name__ == "__main__":
    main()
