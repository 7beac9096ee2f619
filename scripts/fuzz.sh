#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ (the protocol crate's parsers of untrusted bytes) for
# NVMF_FUZZ_SECONDS each (default 60), installing cargo-fuzz first when it is missing. The
# project builds on stable Rust; cargo-fuzz's nightly flags are accepted with RUSTC_BOOTSTRAP=1.
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
mkdir -p "$LOGS"
cd fuzz
targets=$(cargo fuzz list)
if [ -n "${NVMF_FUZZ_ONLY:-}" ]; then
  for t in $NVMF_FUZZ_ONLY; do
    grep -qx "$t" <<<"$targets" || { echo "NVMF_FUZZ_ONLY: no target $t (targets: $(echo $targets))" >&2; exit 2; }
  done
  targets=$NVMF_FUZZ_ONLY
fi
echo "== building the fuzz targets (release, sanitizer off: the crates forbid unsafe) =="
cargo fuzz build -O -s none

found=0
for t in $targets; do
  log="$LOGS/$t.log"
  if cargo fuzz run -O -s none "$t" -- -max_total_time="$SECS" -rss_limit_mb=4096 >"$log" 2>&1; then
    runs=$(grep -o 'Done [0-9]* runs' "$log" | awk '{print $2}' | tail -1)
    printf '%-22s ok     %s inputs in %s s\n' "$t" "${runs:-?}" "$SECS"
  else
    found=1
    crash=$(grep -o 'artifact_prefix=[^;]*; Test unit written to [^ ]*' "$log" | sed 's/.*written to //' | tail -1)
    printf '%-22s FOUND  %s (log %s)\n' "$t" "${crash:-see the log}" "$log"
  fi
done
exit $found
