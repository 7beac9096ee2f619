#!/usr/bin/env bash
# The benchmarks of docs/performance.md, with one command: builds release, runs every figure
# NVMF_BENCH_RUNS times (interleaved across cases: this machine's speed swings in minute-long
# stretches), prints markdown tables of the median (min-max) and writes build/bench/bench.json.
#
#   (a) wire    the soft in-process fabric's limit (transport API only), the cores' cache line
#               round trip
#   (b) inproc  nvmf-tgt engine + nvmf-perf engine in one process (in-process fabric)
#   (c) tcp     nvmf-tgt + nvmf-perf as processes over soft TCP on loopback, and its ceiling:
#               the kernel's loopback TCP alone moving the same bytes per I/O
#   (e) qpairs  1 / 64 / 1024 qpairs on one target reactor, IOPS and RSS (in-process and TCP;
#               over TCP also the kernel's loopback limit for the same busy connections)
#   (d) cost    instructions per I/O per side and the top functions (valgrind callgrind)
#
# Knobs: NVMF_BENCH_RUNS (default 5), NVMF_BENCH_SECONDS per run and case (default 3),
# NVMF_BENCH_ONLY (space-separated subset of: wire inproc tcp qpairs cost),
# NVMF_BENCH_TARGET_CORE (0), NVMF_BENCH_HOST_CORE (1), NVMF_BENCH_PORT (4520),
# NVMF_BENCH_COST_IOS (50000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

RUNS=${NVMF_BENCH_RUNS:-5}
SECS=${NVMF_BENCH_SECONDS:-3}
ONLY=${NVMF_BENCH_ONLY:-wire inproc tcp qpairs cost}
TCORE=${NVMF_BENCH_TARGET_CORE:-0}
HCORE=${NVMF_BENCH_HOST_CORE:-1}
PORT=${NVMF_BENCH_PORT:-4520}
COST_IOS=${NVMF_BENCH_COST_IOS:-50000}
OUT=build/bench
mkdir -p "$OUT"

echo "== building nvmf-bench, nvmf-tgt, nvmf-perf (release) =="
cargo build --release -q -p nvmf-bench -p nvmf-target -p nvmf-initiator
BIN=build/release

COMMON=(--runs "$RUNS" --seconds "$SECS" --target-core "$TCORE" --host-core "$HCORE" --json)
files=()
want() { [[ " $ONLY " == *" $1 "* ]]; }
step() {
  local name=$1; shift
  echo "== $name: $* ==" >&2
  local t0=$SECONDS
  "$BIN/nvmf-bench" "$@" >"$OUT/$name.json"
  files+=("$OUT/$name.json")
  echo "   done in $((SECONDS - t0)) s" >&2
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
want wire && step wire wire "${COMMON[@]}"
want inproc && step inproc inproc "${COMMON[@]}"
want tcp && step tcp tcp "${COMMON[@]}" --port "$PORT" --work-dir "$OUT"
if want qpairs; then
  step qpairs-inproc qpairs "${COMMON[@]}" --fabric inproc
  step qpairs-tcp qpairs "${COMMON[@]}" --fabric tcp --port "$((PORT + 1))" --work-dir "$OUT"
fi
if want cost; then
  command -v valgrind >/dev/null || { echo "valgrind missing (scripts/setup.sh installs it)" >&2; exit 1; }
  step cost cost --ios "$COST_IOS" --out-dir "$OUT/callgrind" --json
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
header="Machine: $(nproc) CPUs, $cpu, $(uname -r). N = $RUNS runs per case, $SECS s each; \
cells are median (min-max). Load average before / after: $load_before / $load_after. $(date -u +%Y-%m-%dT%H:%MZ)."
"$BIN/nvmf-bench" report "${files[@]}" --out "$OUT/bench.json" --header "$header" | tee "$OUT/bench.md"
echo "JSON: $OUT/bench.json  markdown: $OUT/bench.md" >&2
