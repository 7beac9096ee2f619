#!/bin/bash
# Guest script: everything the transport and poll group must show on real verbs (rxe0):
# nvmf-rdma devices, the conformance suite, the verbs provider's live tests, the poll-group
# suite, pingpong (right and wrong GID index). Test binaries are built on the host first:
#   cargo build -p nvmf-transport --bin nvmf-rdma && cargo test -p nvmf-transport --no-run
. "$(dirname "$0")/guest-lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
newest() { ls -t "$ROOT"/build/debug/deps/$1-* 2>/dev/null | grep -v '\.d$' | head -1; }
CONF=$(newest conformance); PG=$(newest pollgroup); LIB=$(newest nvmf_transport); RDMA=$ROOT/build/debug/nvmf-rdma
for b in "$CONF" "$PG" "$LIB" "$RDMA"; do [ -x "$b" ] || { echo "missing test binary ($b): build on the host first"; exit 2; }; done
fail=0
step "network: netdev $NETDEV $IP mtu $MTU"; setup_net
step "rdma_rxe"; setup_rxe || exit 1
export NVMF_TEST_IP=$IP NVMF_TEST_DEVICE=rxe0 NVMF_TEST_PATIENCE_SECS=120

step "nvmf-rdma devices --ip $IP"
"$RDMA" --provider verbs devices --ip "$IP" || fail=1

step "conformance suite on rxe0"
"$CONF" conformance_verbs --include-ignored --test-threads=1 2>&1 || fail=1

step "verbs provider live tests on rxe0 (verbs_live_*, ignored off the lab)"
NVMF_LAB_IP=$IP "$LIB" verbs_live --include-ignored --test-threads=1 2>&1 || fail=1

step "poll-group suite on rxe0 (orphans, drains, overrun, 1000 qpairs)"
"$PG" pollgroup_verbs --include-ignored --test-threads=1 --nocapture 2>&1 | grep -v '^$' || fail=1

step "nvmf-rdma pingpong over rxe0 (GID index $GIDX)"
"$RDMA" --provider verbs pingpong server --listen "$IP:18515" > /tmp/pp_srv.log 2>&1 & S=$!
sleep 1
timeout 300 "$RDMA" --provider verbs pingpong client --connect "$IP:18515" --iters 200 --sizes 64,4096,65536 || fail=1
wait $S || fail=1; echo "--- server:"; cat /tmp/pp_srv.log

step "nvmf-rdma pingpong with a wrong GID index (0): must fail naming index $GIDX"
"$RDMA" --provider verbs pingpong server --listen "$IP:18516" --gid-index 0 > /tmp/pp_srv2.log 2>&1 & S=$!
sleep 1
out=$(timeout 60 "$RDMA" --provider verbs pingpong client --connect "$IP:18516" --gid-index 0 2>&1); rc=$?
echo "$out"; kill $S 2>/dev/null
if [ $rc -ne 0 ] && echo "$out" | grep -q "use GID index $GIDX"; then echo "wrong GID index: refused with the right hint"; else echo "wrong GID index: NOT handled"; fail=1; fi

step "done (fail=$fail)"
exit $fail
