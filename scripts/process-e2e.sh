#!/usr/bin/env bash
# The separate-process end-to-end tests (tests/tests/process/): nvmf-tgt and the initiator tools
# as their own processes over the soft RDMA provider's TCP fabric; nvmf-tgt SIGKILLed under
# nvmf-perf load, restarted, the host reconnects and its flushed data reads back (issue 9,
# reconnect.rs); nvmf write-zeroes, dsm and flush on a file and a malloc namespace
# (block_commands.rs); nvmf-perf --per-io-keys counting the keys the host invalidated itself
# against an nvmf-tgt with remote_invalidate = false, and none against the default
# (per_io_keys.rs); nvmf show-regs reading nvmf-tgt's properties (registers.rs); nvmf get-feature
# of the Host Identifier with its 16 bytes of data, set-feature of it refused (features.rs). They start
# the built binaries, which a test of another package cannot name, so they are #[ignore]d in a
# plain `cargo test` and run here after building them fresh.
# scripts/test.sh calls this; it also runs on its own.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

cargo build -q -p nvmf-target --bin nvmf-tgt
cargo build -q -p nvmf-initiator --bin nvmf --bin nvmf-perf
NVMF_BIN_DIR="$PWD/${CARGO_TARGET_DIR:-build}/debug" \
  cargo test -p nvmf-tests --test process -- --include-ignored
