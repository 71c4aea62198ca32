#!/usr/bin/env bash
# Regenerates the AIGER/BLIF fixtures from circuitgraph's netlists with yosys
# (Debian `yosys`, 0.23 used here). CI never runs this: the outputs are committed.
#   bash tests/circuits/data/make_fixtures.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nl="$(python -c 'import circuitgraph, os; print(os.path.join(os.path.dirname(circuitgraph.__file__), "netlists"))')"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
# A flop cell for the ISCAS-89 s27 netlist (circuitgraph's `ff` blackbox).
cat > "$tmp/ff.v" <<'V'
module ff(CK, D, Q); input CK, D; output reg Q; always @(posedge CK) Q <= D; endmodule
V
# yosys names the nets it adds after the source file: read copies by their
# bare names so that no local path ends up in the fixtures.
cp "$nl"/{ctrl,dec,int2float,router,cavlc,priority_ckt,s27,s13207}.v "$tmp"/
# Structure-preserving flow: every and/or/nand/nor gate of the .v netlist
# becomes one 2-input cell (techmap, no optimisation), so the BLIF keeps the
# gates and net names, and the AIG has one AND per 2-input and/or/nand/nor gate.
for c in ctrl dec int2float router cavlc priority_ckt s27 s13207; do
  extra=""
  [ "$c" = s27 ] && extra="ff.v"
  yosys -q -p "read_verilog $extra $c.v; hierarchy -top $c; proc; flatten;
    techmap; opt_clean; write_blif $here/$c.blif; aigmap;
    write_aiger -ascii -symbols $here/$c.aag; write_aiger -symbols $here/$c.aig"
done
# Synthesised flow: ABC rewrites the logic, so only the function is comparable;
# `abc -sop` leaves multi-cube sum-of-products covers in the BLIF.
for c in int2float cavlc; do
  yosys -q -p "read_verilog $c.v; synth -flatten -top $c; abc -sop -I 4 -P 6;
    opt_clean; write_blif $here/${c}_sop.blif"
  yosys -q -p "read_verilog $c.v; synth -flatten -top $c; aigmap; opt_clean;
    write_aiger -symbols $here/${c}_synth.aig"
done
