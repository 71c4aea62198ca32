#!/usr/bin/env bash
# Regenerates the yosys_* fixtures: real `write_verilog` output (default and
# -noexpr) for tests/circuits/test_yosys.py, and the references it is checked
# against. Needs yosys (Debian `yosys`, 0.23 used here) and the venv; CI never
# runs this: the outputs are committed.
#   bash tests/circuits/data/make_yosys_fixtures.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nl="$(python -c 'import circuitgraph, os; print(os.path.join(os.path.dirname(circuitgraph.__file__), "netlists"))')"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
# Every kind of flip-flop yosys maps to a gate cell: plain, async reset, sync
# reset, enable, reset + enable both ways round, set/reset, async load, negedge.
cat > ffs.v <<'V'
module ffs(input clk, rst, rst_n, en, set, ld, input [3:0] a, b, ad,
           output reg [3:0] q_plain, q_arst, q_srst, q_en, q_srst_en, q_ce,
           output reg q_sr, q_ald, q_neg,
           output [3:0] y);
  wire [3:0] x = (a & ~b) ^ (en ? a : b);
  assign y = ~(x | {b[0], a[3:1]});
  always @(posedge clk) q_plain <= x;
  always @(posedge clk or posedge rst) if (rst) q_arst <= 4'h5; else q_arst <= a ^ b;
  always @(posedge clk) if (!rst_n) q_srst <= 4'h0; else q_srst <= a | b;
  always @(posedge clk) if (en) q_en <= x;
  always @(posedge clk) if (rst) q_srst_en <= 4'ha; else if (en) q_srst_en <= b;
  always @(posedge clk) if (en) begin if (rst) q_ce <= 4'h3; else q_ce <= a; end
  always @(posedge clk or posedge set or negedge rst_n)
    if (!rst_n) q_sr <= 0; else if (set) q_sr <= 1; else q_sr <= a[0] & b[0];
  always @(posedge clk or posedge ld) if (ld) q_ald <= ad[0]; else q_ald <= a[1];
  always @(negedge clk) q_neg <= ^a;
endmodule
V
yosys -q -p "read_verilog ffs.v; synth -top ffs; opt_clean -purge;
  write_verilog -noexpr $here/yosys_ffs_noexpr.v; write_verilog $here/yosys_ffs.v"
# The reference: the same design with every asynchronous control made
# synchronous (the reader models async as sync), flops unmapped to plain
# D flip-flops and logic (dffunmap), as BLIF.
sed -e 's/ or posedge rst)/)/; s/ or posedge set or negedge rst_n)/)/; s/ or posedge ld)/)/' \
  ffs.v > ffs_sync.v
yosys -q -p "read_verilog ffs_sync.v; synth -top ffs; dffunmap; opt_clean -purge;
  write_blif $here/yosys_ffs_sync.blif"
# Bus connections (assign y = a, { 4'h9, b }) and a flattened instance's
# escaped bus bits (\u1.t [0]); the reference is yosys's own BLIF.
cat > bus.v <<'V'
module sub(input [3:0] a, b, output [3:0] s);
  wire [3:0] t = a ^ b;
  assign s = {t[2:0], t[3]} & a;
endmodule
module bus(input clk, input [3:0] a, b, output [3:0] y, z, output reg [3:0] q,
           output [7:0] w, output k);
  sub u1(.a(a), .b(b), .s(z));
  assign y = a;
  assign w = {4'h9, b};
  always @(posedge clk) q <= a + b;
  assign k = 1'b0;
endmodule
V
yosys -q -p "read_verilog bus.v; synth -flatten -top bus; opt_clean -purge;
  write_verilog -noexpr $here/yosys_bus_noexpr.v; write_verilog $here/yosys_bus.v;
  write_blif $here/yosys_bus.blif"
# A circuitgraph netlist after synthesis (ABC rewrites it: function only).
cp "$nl/c432.v" .
yosys -q -p "read_verilog c432.v; synth -flatten -top c432; opt_clean -purge;
  write_verilog -noexpr $here/yosys_c432_noexpr.v; write_verilog $here/yosys_c432.v"
