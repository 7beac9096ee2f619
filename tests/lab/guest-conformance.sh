#!/bin/bash
# Guest script: the transport conformance suite on real verbs (Soft-RoCE rxe0).
# The test binary is built on the host (`cargo test -p nvmf-transport --test conformance --no-run`)
# and run here by its host path; NVMF_CONFORMANCE_BIN overrides which one.
. "$(dirname "$0")/guest-lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${NVMF_CONFORMANCE_BIN:-$(ls -t "$ROOT"/build/debug/deps/conformance-* 2>/dev/null | grep -v '\.d$' | head -1)}
[ -x "$BIN" ] || { echo "no conformance test binary under $ROOT/build/debug/deps: build it on the host first"; exit 2; }
step "network: netdev $NETDEV $IP mtu $MTU"; setup_net
step "rdma_rxe"; setup_rxe || exit 1
step "conformance suite on rxe0 ($BIN)"
export NVMF_TEST_IP=$IP NVMF_TEST_DEVICE=rxe0 NVMF_TEST_PATIENCE_SECS=120 NVMF_TEST_MANY_QPS=${NVMF_TEST_MANY_QPS:-1000}
"$BIN" conformance_verbs --include-ignored --test-threads=1 2>&1
rc=$?
step "done (rc=$rc)"
exit $rc
