#!/usr/bin/env bash
# GPU day in one command (under 7 minutes on one GPU): the tests that need CUDA,
# the planner's CUDA calibration and the GPU rows of the benchmarks.
#
#   bash benchmarks/gpu_check.sh             # on a CUDA machine -> results/gpu.json
#   bash benchmarks/gpu_check.sh --dry-run   # anywhere: print and validate the
#                                            # commands (flags, test selection)
#   bash benchmarks/gpu_check.sh --out PATH  # where the JSON goes
#
# Steps (each under its own timeout, all of them run even when one fails):
#   tests      pytest: every test that skips without CUDA (named cuda/nccl)
#   calibrate  python -m leangnn.plan.calibrate --device cuda --quick --repeat 1
#   plan       benchmarks/plan.py --device cuda --quick --section estimate
#              (estimate vs max_memory_allocated)
#   auto       benchmarks/plan_fresh.py --device cuda: leangnn train --strategy
#              auto at 0.6 x full batch's need on two graphs, as a user runs it
#   gsr        benchmarks/gsr.py --device cuda --quick, memory and speed sections
#   offload    benchmarks/offload.py --quick, the timing section on CUDA only
#              (its CPU row is the CPU machine's)
# benchmarks/dpr.py has no CUDA path (CPU serving comparison); it is listed
# as skipped. Results of each benchmark go to results/gpu/, never over the CPU
# results; results/gpu.json records every step's command, exit status, time
# and output tail, results/gpu/<step>.log its whole output.
set -u
cd "$(dirname "$0")/.."

DRY=0
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) shift; OUT="${1:?--out needs a path}" ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$OUT" ]; then
  if [ "$DRY" = 1 ]; then OUT=results/quick/gpu_dryrun.json; else OUT=results/gpu.json; fi
fi
PY=${PYTHON:-python}
LOGDIR=$(mktemp -d)
trap 'rm -rf "$LOGDIR"' EXIT

# the CUDA tests: files that skip on torch.cuda.is_available(), tests named cuda/nccl
CUDA_FILES=$(grep -rl "cuda.is_available()" tests --include='test_*.py' | sort | tr '\n' ' ')
SELECT="cuda or nccl"

# name|timeout seconds|command (budget: 420 s in all; a fresh process per
# run pays CUDA's start, ~10 s, so each step keeps its process count small).
# The CUDA caching allocator does not vary from process to process as glibc's
# heap does, so one run per configuration (--repeat 1) is enough there.
STEPS=(
  "tests|80|$PY -m pytest -q --tb=short -rfEs -p no:cacheprovider -m 'not slow or slow' -k '$SELECT' $CUDA_FILES"
  "calibrate|60|$PY -m leangnn.plan.calibrate --device cuda --quick --repeat 1"
  "plan|70|$PY benchmarks/plan.py --device cuda --quick --section estimate --out results/gpu/plan.json --md results/gpu/plan.md --plot results/gpu/plan_scatter.png"
  "auto|50|$PY benchmarks/plan_fresh.py --device cuda --budget-fraction 0.6 --repeat 1 --only arbiter b22 --out results/gpu/plan_fresh.json"
  "gsr|70|$PY benchmarks/gsr.py --quick --device cuda --sections memory,speed --out results/gpu/gsr.json --md results/gpu/gsr.md --plot results/gpu/gsr_memory.png"
  "offload|90|$PY benchmarks/offload.py --quick --skip circuits sweep min-budget baseline overhead --timing-devices cuda --out results/gpu/offload.json --markdown results/gpu/offload.md"
)

validate() {
  # Every flag of every benchmark command must be one its script offers, and
  # the test selection must collect at least one test; runs on CPU.
  local status=0
  for step in "${STEPS[@]}"; do
    IFS='|' read -r name _ cmd <<< "$step"
    echo "[$name] $cmd"
  done
  $PY - "${STEPS[@]}" <<'EOF' || status=1
import contextlib, io, runpy, shlex, sys
bad = 0
for step in sys.argv[1:]:
    name, _, cmd = step.split("|", 2)
    argv = shlex.split(cmd)
    if "pytest" in argv:
        continue
    target = argv[argv.index("-m") + 1] if "-m" in argv else argv[1]
    flags = {a.split("=")[0] for a in argv if a.startswith("--")}
    buf = io.StringIO()
    sys.argv = [target, "--help"]
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        if target.endswith(".py"):
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__")
    missing = sorted(f for f in flags if f not in buf.getvalue())
    print(f"  {name}: {'ok' if not missing else 'unknown flags ' + ', '.join(missing)}")
    bad += bool(missing)
sys.exit(1 if bad else 0)
EOF
  local n
  n=$(eval "$PY -m pytest -q --collect-only -p no:cacheprovider -m 'not slow or slow' -k '$SELECT' $CUDA_FILES" 2>/dev/null | grep -c '::' || true)
  echo "  tests: $n CUDA tests selected in: $CUDA_FILES"
  [ "$n" -gt 0 ] || status=1
  return $status
}

record() {  # write the JSON (atomically) from the step logs
  $PY - "$OUT" "$LOGDIR" "$DRY" "${STEPS[@]}" <<'EOF'
import json, sys, time
from pathlib import Path
from leangnn.utils import atomic_write_text
out, logdir, dry, steps = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1", sys.argv[4:]
rows = []
for step in steps:
    name, limit, cmd = step.split("|", 2)
    meta = logdir / f"{name}.meta"
    row = {"step": name, "command": cmd, "timeout_s": int(limit)}
    if meta.exists():
        rc, ms = meta.read_text().split()
        row.update(rc=int(rc), seconds=int(ms) / 1000, ok=rc == "0",
                   output_tail=(logdir / f"{name}.log").read_text(errors="replace")[-4000:])
    rows.append(row)
rows.append({"step": "dpr", "skipped": "benchmarks/dpr.py has no CUDA path"})
try:
    import torch
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
except Exception:  # noqa: BLE001
    gpu = None
doc = {"dry_run": dry, "gpu": gpu, "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
       "steps": rows}
Path(out).parent.mkdir(parents=True, exist_ok=True)
atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
print(f"gpu_check: wrote {out}")
EOF
}

if [ "$DRY" = 1 ]; then
  validate; status=$?
  echo "$status 0" > "$LOGDIR/validate.meta"
  record
  exit $status
fi

if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check.sh: CUDA is not available here (use --dry-run to check the commands)" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv
mkdir -p results/gpu
fail=0
for step in "${STEPS[@]}"; do
  IFS='|' read -r name limit cmd <<< "$step"
  echo "== $name (max ${limit}s): $cmd"
  start=$(date +%s%N)
  eval "timeout $limit $cmd" > "$LOGDIR/$name.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  tail -n 5 "$LOGDIR/$name.log"
  echo "   -> exit $rc in $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s"
  echo "$rc $ms" > "$LOGDIR/$name.meta"
  cp "$LOGDIR/$name.log" "results/gpu/$name.log"  # whole, beside the JSON's tail
  [ "$rc" = 0 ] || fail=1
done
record
exit $fail
