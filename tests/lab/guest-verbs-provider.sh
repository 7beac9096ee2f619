#!/bin/bash
# Guest script: the nvmf-transport verbs provider's live tests (verbs_live_*) against Soft-RoCE.
# Build the test binary on the host first:
#   CARGO_TARGET_DIR=/work/main/build/h-verbs \
#     cargo test -p nvmf-transport --no-default-features --features rdma --lib --no-run
# then: /work/shared/lab/qemu/run-guest.sh /work/main/tests/lab/guest-verbs-provider.sh
# VERBS_TEST_BIN (below) may name the binary; else the newest one in the helper's target dir.
. /work/shared/lab/qemu/guest-lib.sh
BIN=${VERBS_TEST_BIN:-$(ls -t /work/main/build/h-verbs/debug/deps/nvmf_transport-* 2>/dev/null | grep -v '\.d$' | head -1)}
[ -x "$BIN" ] || { echo "no test binary (build it on the host first): '$BIN'"; exit 1; }
step "network: netdev $NETDEV $IP mtu $MTU"; setup_net
step "rdma_rxe"; setup_rxe || exit 1
step "verbs provider live tests: $BIN"
export NVMF_LAB_IP=$IP RUST_BACKTRACE=1
"$BIN" verbs_live --include-ignored --test-threads=1 --nocapture; rc=$?
step "done (rc=$rc)"
dmesg | grep -iE 'rxe|rdma|infiniband' | tail -10
exit $rc
