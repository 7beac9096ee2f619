#!/usr/bin/env bash
# Runs every test of nvmf-rs: formatting, clippy, and the whole workspace's tests (unit,
# conformance on the soft provider's in-process and TCP fabrics, end-to-end). Calls setup.sh
# first, so this is the only command a fresh Debian machine needs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

step() { printf '\n== %s ==\n' "$*"; }
t0=$(date +%s)
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets -q -- -D warnings
step "cargo clippy of the fuzzing entry points (features no workspace build turns on; fuzz/ calls them)"
cargo clippy -q -p nvmf-transport -p nvmf-target -p nvmf-initiator \
  --features nvmf-transport/fuzzing,nvmf-target/fuzzing,nvmf-initiator/fuzzing -- -D warnings
step "cargo test --workspace"
mkdir -p build
cargo test --workspace 2>&1 | tee build/test-output.log
step "separate processes: nvmf-tgt killed and restarted under nvmf-perf; nvmf write-zeroes, dsm, flush; nvmf-perf counting the keys the host invalidated; nvmf show-regs (scripts/process-e2e.sh)"
# Counted below with the rest (it is also among the workspace run's skipped: #[ignore]d there).
bash scripts/process-e2e.sh 2>&1 | tee -a build/test-output.log
# A plain closing line that counts every test binary's results together.
awk '/^test result:/ { p += $4; f += $6; i += $8 }
     END { printf "\ntests: %d passed, %d failed, %d skipped\n", p, f, i }' build/test-output.log
printf 'total time: %ss\n' "$(( $(date +%s) - t0 ))"
