#!/usr/bin/env bash
# The separate-process end-to-end test (issue 9): nvmf-tgt and the initiator tools as their own
# processes over the soft RDMA provider's TCP fabric; nvmf-tgt SIGKILLed under nvmf-perf load,
# restarted, the host reconnects and its flushed data reads back
# (tests/tests/process_reconnect.rs). That test starts the built binaries, which a test of
# another package cannot name, so it is #[ignore]d in a plain `cargo test` and run here after
# building them fresh. scripts/test.sh calls this; it also runs on its own.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

cargo build -q -p nvmf-target --bin nvmf-tgt
cargo build -q -p nvmf-initiator --bin nvmf --bin nvmf-perf
NVMF_BIN_DIR="$PWD/${CARGO_TARGET_DIR:-build}/debug" \
  cargo test -p nvmf-tests --test process_reconnect -- --include-ignored
