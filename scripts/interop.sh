#!/usr/bin/env bash
# Real verbs and the Linux kernel's NVMe-oF host and target, in the QEMU lab (tests/lab), as one
# command. Sets the lab up (Debian packages only; quick when present), builds only what the
# requested suites need, boots ONE guest that runs them all, then prints each suite's closing
# line and wall time and a total. Exit status non-zero when any check failed.
#
#   scripts/interop.sh [suite...]      default: all
#
# Suites (tests/lab/suite-*.sh):
#   verbs          transport live tests, conformance and poll-group suites, nvmf-rdma pingpong on rxe
#   kernel-peers   nvme-cli/nvme-rdma against nvmet-rdma: the kernel's own plumbing, same checks
#   kernel-host    nvme-cli/nvme-rdma against nvmf-tgt (fio verify, Write Zeroes and discard, ext4)
#   kernel-target  nvmf discover/identify, write/read through a shared queue data region,
#                  write-zeroes/dsm/flush, and nvmf-perf --verify (also with --per-io-keys)
#                  against nvmet-rdma
#   faults         nvmf-perf killed, nvme disconnect and nvmf-tgt SIGTERM under load; a target
#                  that leaves per-I/O keys valid (the host's LOCAL_INV)
#   all            every suite above
#   bench          not in `all` (about 15 min): the Linux host + fio against nvmf-tgt (release
#                  build) and against nvmet-rdma, alternated, in one boot; the table ours / kernel
#                  in build/lab/results/bench.md and bench.json
# A suite whose binary does not exist yet reports its checks as skipped, never as passed.
# Env: SMP (guest CPUs, 2), MEM (guest memory, 3G), LIMIT_<suite> (seconds; '-' as '_');
#      bench: BENCH_REPS (rounds of A B, 3), BENCH_RUNTIME (seconds per fio job, 20),
#      BENCH_TGT_CPU (guest CPU of nvmf-tgt, 1; fio is on CPU 0).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ALL=(verbs kernel-peers kernel-host kernel-target faults)
EXTRA=(bench)   # run only when named: too long for CI's budget
say() { printf '[interop] %s\n' "$*"; }
die() { printf '[interop] ERROR: %s\n' "$*" >&2; exit 2; }

want=()
for a in "${@:-all}"; do
  case $a in
    all) want+=("${ALL[@]}");;
    verbs|kernel-peers|kernel-host|kernel-target|faults|bench) want+=("$a");;
    -h|--help) sed -n '2,/^set -eu/{/^set/d;s/^# \{0,1\}//;p}' "$0"; exit 0;;
    *) die "unknown suite '$a' (suites: ${ALL[*]} all ${EXTRA[*]})";;
  esac
done
SUITES=()   # in the canonical order, once each
for s in "${ALL[@]}" "${EXTRA[@]}"; do case " ${want[*]} " in *" $s "*) SUITES+=("$s");; esac; done
needs() { local s; for s in "${SUITES[@]}"; do case " $* " in *" $s "*) return 0;; esac; done; return 1; }
case "$ROOT" in /tmp/*|/run/*|/dev/*|/proc/*|/sys/*)
  die "the guest mounts its own /tmp and /run: clone nvmf-rs elsewhere (it is at $ROOT)";; esac

T0=$(date +%s)
say "suites: ${SUITES[*]}"
bash scripts/setup.sh
bash tests/lab/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
T_SETUP=$(date +%s)

# ---- build: only what the suites run; cargo's JSON messages name the executables ----
OUT=$ROOT/build/lab
mkdir -p "$OUT"
artifacts() {   # "<kind> <name> <test?> <path>" per executable cargo reports
  jq -r 'select(.reason == "compiler-artifact" and .executable != null)
         | "\(.target.kind[0]) \(.target.name) \(.profile.test) \(.executable)"'
}
exe() { awk -v k="$1" -v n="$2" -v t="$3" '$1 == k && $2 == n && $3 == t { p = $4 } END { print p }' "$OUT/artifacts"; }
: > "$OUT/artifacts"
if needs verbs; then
  say "building nvmf-rdma and nvmf-transport's test executables (lib, conformance, pollgroup)"
  # Integration tests make cargo build the package's binaries too: nvmf-rdma comes with them.
  cargo test -p nvmf-transport --lib --test conformance --test pollgroup --no-run \
    --message-format=json-render-diagnostics | artifacts >> "$OUT/artifacts"
fi
daemons=()
needs kernel-host faults && daemons+=(nvmf-tgt)
needs kernel-target faults && daemons+=(nvmf nvmf-perf)
if [ ${#daemons[@]} -gt 0 ] || needs bench; then
  in_workspace=$(cargo metadata --no-deps --format-version 1 | jq -r '.packages[].targets[] | select(.kind | index("bin")) | .name')
  build=()
  for b in "${daemons[@]}"; do
    if grep -qx "$b" <<< "$in_workspace"; then build+=(--bin "$b")
    else say "$b is not in the workspace yet: the checks that need it will be skipped"; fi
  done
  if [ ${#build[@]} -gt 0 ]; then
    say "building ${build[*]//--bin /}"
    cargo build "${build[@]}" --message-format=json-render-diagnostics | artifacts >> "$OUT/artifacts"
  fi
  # The bench suite measures: it runs an optimised nvmf-tgt, never the debug build the others use.
  if needs bench && grep -qx nvmf-tgt <<< "$in_workspace"; then
    say "building nvmf-tgt (release) for the bench suite"
    cargo build --release --bin nvmf-tgt --message-format=json-render-diagnostics |
      artifacts | sed 's/^bin nvmf-tgt /bin nvmf-tgt-release /' >> "$OUT/artifacts"
  fi
fi
# The guest sources this (tests/lab/guest-suites.sh); an empty path means "not built".
{
  echo "RDMA_BIN=$(exe bin nvmf-rdma false)"
  echo "TRANSPORT_LIB_TEST_BIN=$(exe lib nvmf_transport true)"
  echo "CONFORMANCE_BIN=$(exe test conformance true)"
  echo "POLLGROUP_BIN=$(exe test pollgroup true)"
  echo "TGT_BIN=$(exe bin nvmf-tgt false)"
  echo "NVMF_BIN=$(exe bin nvmf false)"
  echo "PERF_BIN=$(exe bin nvmf-perf false)"
  echo "TGT_RELEASE_BIN=$(exe bin nvmf-tgt-release false)"
  for s in "${ALL[@]}" "${EXTRA[@]}"; do v=LIMIT_${s//-/_}; [ -n "${!v:-}" ] && echo "$v=${!v}"; done
  for v in BENCH_REPS BENCH_RUNTIME BENCH_TGT_CPU; do [ -n "${!v:-}" ] && echo "$v=${!v}"; done
} > "$OUT/bins.env"
if needs verbs; then
  grep -E '^(RDMA|TRANSPORT_LIB_TEST|CONFORMANCE|POLLGROUP)_BIN=$' "$OUT/bins.env" &&
    die "cargo did not report every executable the verbs suite needs (see $OUT/artifacts)"
fi
T_BUILD=$(date +%s)

# ---- one guest boot for every suite ----
# bench: per round and target, 3 fio jobs (runtime + 2 s ramp + ~20 s of fio start-up and
# accounting under TCG) and ~90 s of connect, fill and teardown; then a margin.
bench_limit() { echo $(( ${BENCH_REPS:-3} * 2 * (3 * (${BENCH_RUNTIME:-20} + 22) + 90) + 300 )); }
[ -z "${LIMIT_bench:-}" ] && needs bench && echo "LIMIT_bench=$(bench_limit)" >> "$OUT/bins.env"
limit=300   # boot, rxe set-up, power-off
for s in "${SUITES[@]}"; do
  v=LIMIT_${s//-/_}
  case $s in verbs) d=1500;; kernel-host|faults) d=900;; bench) d=$(bench_limit);; *) d=600;; esac
  limit=$((limit + ${!v:-$d}))
done
say "booting the guest (SMP ${SMP:-2}, MEM ${MEM:-3G}, limit ${limit}s); logs in $OUT/results"
set +e
NVMF_LAB_RESULTS=$OUT/results TIMEOUT=$limit SMP=${SMP:-2} MEM=${MEM:-3G} \
  tests/lab/run-guest.sh tests/lab/guest-suites.sh \
  "lab.suites=$(IFS=,; echo "${SUITES[*]}")" "lab.env=$OUT/bins.env"
guest_rc=$?
set -e
T_GUEST=$(date +%s)

# ---- per-suite results ----
echo
echo "== interop results =="
passed=0 failed=0 skipped=0 bad=0
for s in "${SUITES[@]}"; do
  line=$(awk -F'\t' -v s="$s" '$1 == s' "$OUT/results/summary" 2>/dev/null || true)
  if [ -z "$line" ]; then
    printf '%-14s %8s  %s\n' "$s" "-" "$s: did not run (the guest died or timed out; see $OUT/results/guest.log)"
    bad=1; continue
  fi
  IFS=$'\t' read -r _ rc wall closing <<< "$line"
  printf '%-14s %7ss  %s\n' "$s" "$wall" "$closing"
  [ "$rc" = 0 ] || bad=1
  if [[ $closing =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped ]]; then
    passed=$((passed + BASH_REMATCH[1])) failed=$((failed + BASH_REMATCH[2])) skipped=$((skipped + BASH_REMATCH[3]))
  fi
done
[ $guest_rc -eq 0 ] || bad=1
printf 'interop: %d passed, %d failed, %d skipped (setup %ds, build %ds, guest %ds, total %ds)\n' \
  $passed $failed $skipped $((T_SETUP - T0)) $((T_BUILD - T_SETUP)) $((T_GUEST - T_BUILD)) $((T_GUEST - T0))
[ $bad -eq 0 ] && [ $failed -eq 0 ]
