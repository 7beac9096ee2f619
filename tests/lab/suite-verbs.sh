#!/bin/bash
# Suite `verbs` (guest): the transport on real verbs (Soft-RoCE rxe0). The verbs provider's live
# tests, the transport conformance suite and the poll-group suite (each test one check), then
# nvmf-rdma devices and pingpong. Every verbs test skips with a notice where there is no device;
# here a missing device or such a notice is a failure, never a pass.
# Needs: guest-suites.sh set up dummy0 + rxe0 ($GIDX) and exported the binaries' paths.
SUITE=verbs
. "$(dirname "$0")/guest-lib.sh"
. "$(dirname "$0")/suite-lib.sh"
export NVMF_TEST_IP=$IP NVMF_TEST_DEVICE=rxe0 NVMF_TEST_PATIENCE_SECS=120 NVMF_LAB_IP=$IP

check "rxe0 is an ACTIVE RDMA link on $NETDEV" sh -c 'rdma link show rxe0/1 | grep -q "state ACTIVE"'
check "RoCE v2 GID for $IP found (index ${GIDX:-none})" test -n "$GIDX"
[ -x "$RDMA_BIN" ] || { fail "nvmf-rdma not built ($RDMA_BIN)"; finish; exit; }
devices() {   # the verbs provider sees rxe0 and picks the GID index setup_rxe found
  "$RDMA_BIN" --provider verbs devices --ip "$IP" > "$LOGS/devices.log" 2>&1 || return
  cat "$LOGS/devices.log"
  grep -q "^hca_id: rxe0 " "$LOGS/devices.log" &&
    grep -q "GID index for $IP:[[:space:]]*$GIDX " "$LOGS/devices.log"
}
check "nvmf-rdma devices: rxe0, GID index $GIDX for $IP" devices

# libtest NAME BIN FILTER SECS: run one test executable's FILTER tests (ignored ones too: they
# are ignored off-lab), one check per test. --show-output keeps the status lines clean and still
# prints what passing tests said, so a "SKIP" notice cannot hide.
libtest() {
  local name=$1 bin=$2 filter=$3 secs=$4 out=$LOGS/$1.log rc t res n=0
  if [ ! -x "$bin" ]; then fail "$name: test executable missing ($bin)"; return; fi
  timeout -k 5 "$secs" "$bin" "$filter" --include-ignored --test-threads=1 --show-output \
    > "$out" 2>&1; rc=$?
  while read -r t res; do
    n=$((n + 1))
    case $res in ok) pass "$t";; *) fail "$t ($res)";; esac
  done < <(sed -n 's/^test \(.*\) \.\.\. \(ok\|FAILED\|ignored\)$/\1 \2/p' "$out")
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    fail "$name: timed out after ${secs}s in: $(grep '^test .* \.\.\. *$' "$out" | tail -1)"
  elif [ $rc -ne 0 ] && ! grep -q '\.\.\. FAILED$' "$out"; then
    fail "$name: exited $rc"; show "$out"
  fi
  [ $n -gt 0 ] || { fail "$name: no test matched '$filter'"; show "$out"; }
  if grep -q 'SKIP' "$out"; then fail "$name: a verbs test found no device and skipped"; grep 'SKIP' "$out" | show /dev/stdin 5; fi
}
libtest "verbs provider live tests" "$TRANSPORT_LIB_TEST_BIN" verbs_live 600
libtest "conformance suite" "$CONFORMANCE_BIN" conformance_verbs 900
libtest "poll-group suite" "$POLLGROUP_BIN" pollgroup_verbs 900

# pingpong SERVER_ARGS... -- CLIENT_ARGS...: a server waiting for one client, then the client.
pingpong() {
  local port=$1; shift
  "$RDMA_BIN" --provider verbs pingpong server --listen "$IP:$port" "$@" > "$LOGS/pp-server-$port.log" 2>&1 &
  SERVER=$!
  wait_for 60 grep -q "waiting for a client" "$LOGS/pp-server-$port.log" || {
    echo "server did not come up:"; cat "$LOGS/pp-server-$port.log"; kill $SERVER; return 1; }
}
if pingpong 18515; then
  check "nvmf-rdma pingpong over rxe0: verified SEND/RECV, WRITE, READ at 64 B, 4 KiB, 64 KiB" \
    timeout 300 "$RDMA_BIN" --provider verbs pingpong client --connect "$IP:18515" --iters 200 --sizes 64,4096,65536
  check "pingpong server finished cleanly" wait $SERVER
else fail "pingpong server did not start"; show "$LOGS/pp-server-18515.log"; fi

# A wrong GID index (0 is the link-local GID, not RoCE v2 for $IP) must fail naming the right one.
if pingpong 18516 --gid-index 0; then
  timeout 120 "$RDMA_BIN" --provider verbs pingpong client --connect "$IP:18516" --gid-index 0 > "$LOGS/pp-wrong-gid.log" 2>&1
  rc=$?; kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null
  if [ $rc -ne 0 ] && grep -q "use GID index $GIDX" "$LOGS/pp-wrong-gid.log"; then
    pass "pingpong with GID index 0 is refused, naming index $GIDX"
  else fail "pingpong with GID index 0: exit $rc, no hint naming index $GIDX"; show "$LOGS/pp-wrong-gid.log"; fi
else fail "pingpong server (wrong GID) did not start"; fi

check "no RC QP left on rxe0" wait_for 30 no_rc_qps
finish
