#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ (the protocol crate's parsers of untrusted bytes, the
# target's command path, the whole target against a hostile host, the host (its controller and
# its RDMA queues) against a hostile target, and the soft provider's wire: its CM messages and TCP
# frames) for NVMF_FUZZ_SECONDS each (default 60), installing cargo-fuzz first when it is
# missing. The project builds on stable Rust; cargo-fuzz's nightly flags are accepted
# with RUSTC_BOOTSTRAP=1.
# A target with seed inputs (fuzz/seeds/TARGET) starts from them as well as from its corpus
# (fuzz/corpus/TARGET, kept between runs on one machine).
# Prints one line per target (inputs run, or the crash file libFuzzer wrote) and exits non-zero
# when any target found something. Logs: build/fuzz/TARGET.log.
#
# Knobs: NVMF_FUZZ_SECONDS (per target), NVMF_FUZZ_ONLY (space-separated subset of targets).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
export RUSTC_BOOTSTRAP=1

SECS=${NVMF_FUZZ_SECONDS:-60}
[[ "$SECS" =~ ^[1-9][0-9]*$ ]] || { echo "NVMF_FUZZ_SECONDS=$SECS: a whole number of seconds, 1 or more" >&2; exit 2; }
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz (cargo install cargo-fuzz --locked) =="
  cargo install cargo-fuzz --locked -q
fi

LOGS=$PWD/build/fuzz
ASAN_TARGET_DIR=$PWD/build/fuzz-asan
mkdir -p "$LOGS"
cd fuzz
targets=$(cargo fuzz list)
if [ -n "${NVMF_FUZZ_ONLY:-}" ]; then
  for t in $NVMF_FUZZ_ONLY; do
    grep -qx "$t" <<<"$targets" || { echo "NVMF_FUZZ_ONLY: no target $t (targets: $(echo $targets))" >&2; exit 2; }
  done
  targets=$NVMF_FUZZ_ONLY
fi
# The protocol's, the command path's and the host controller's targets run without a sanitizer (what they
# reach forbids unsafe); the soft provider's, the hostile host's and the host queues' (a transport
# on the soft fabrics) reach the transport crate's unsafe (its copies into registered memory), so
# they run under the address sanitizer, built in a directory of their own so neither build undoes
# the other.
flags_of() {
  case $1 in
    fuzz_soft_* | fuzz_target_hostile_host | fuzz_host_queue_hostile_target) echo "-O -s address --target-dir $ASAN_TARGET_DIR" ;;
    *) echo "-O -s none" ;;
  esac
}
echo "== building the fuzz targets (release; address sanitizer for fuzz_soft_*, fuzz_target_hostile_host and fuzz_host_queue_hostile_target) =="
for t in $targets; do
  # shellcheck disable=SC2046 # the flags are words
  cargo fuzz build $(flags_of "$t") "$t"
done

found=0
for t in $targets; do
  log="$LOGS/$t.log"
  # A target with seed inputs (fuzz/seeds/TARGET, kept current by its harness's unit test)
  # starts from them as well as from its own corpus.
  corpora=()
  if [ -d "seeds/$t" ]; then
    mkdir -p "corpus/$t"
    corpora=("corpus/$t" "seeds/$t")
  fi
  # shellcheck disable=SC2046
  if cargo fuzz run $(flags_of "$t") "$t" "${corpora[@]}" -- -max_total_time="$SECS" -rss_limit_mb=4096 >"$log" 2>&1; then
    runs=$(grep -o 'Done [0-9]* runs' "$log" | awk '{print $2}' | tail -1)
    printf '%-26s ok     %s inputs in %s s\n' "$t" "${runs:-?}" "$SECS"
  else
    found=1
    crash=$(grep -o 'artifact_prefix=[^;]*; Test unit written to [^ ]*' "$log" | sed 's/.*written to //' | tail -1)
    printf '%-26s FOUND  %s (log %s)\n' "$t" "${crash:-see the log}" "$log"
  fi
done
exit $found
