#!/bin/bash
# Suite `kernel-target` (guest): nvmf-rs's host side against the Linux kernel's target
# (nvmet-rdma) over rxe0: nvmf discover, identify, show-regs and the host identifier feature's
# data, a write and read back through a shared
# queue data region, write-zeroes, dsm and flush, then nvmf-perf with --verify on 4 qpairs, and
# with per-I/O keys (memory windows); afterwards no qpair is left on either side.
SUITE=kernel-target
. "$(dirname "$0")/guest-lib.sh"
. "$(dirname "$0")/suite-lib.sh"
. "$(dirname "$0")/nvmeof-lib.sh"
trap 'nvmet_down' EXIT

nvmf_discover() {
  timeout 60 "$NVMF_BIN" -a "$IP" -s $PORT discover | tee "$LOGS/nvmf-discover.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && grep -q "$NQN" "$LOGS/nvmf-discover.log"
}
nvmf_identify() {
  timeout 60 "$NVMF_BIN" -a "$IP" -s $PORT -n "$NQN" id-ctrl | tee "$LOGS/nvmf-identify.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && grep -q "$NQN" "$LOGS/nvmf-identify.log"
}
# The live properties by Property Get, decoded: the controller nvmet enabled and ready.
nvmf_show_regs() {
  local log="$LOGS/nvmf-show-regs.log"
  timeout 60 "$NVMF_BIN" -a "$IP" -s $PORT -n "$NQN" show-regs -H | tee "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && grep -q "^version : " "$log" &&
    grep -q "Enable (EN): 1$" "$log" && grep -q "Ready (RDY): 1$" "$log" &&
    grep -q "Controller Fatal Status (CFS): 0$" "$log"
}
# Get Features Host Identifier with its 16 bytes of data over real verbs: nvmet returns the
# identifier this host connected with.
nvmf_host_identifier() {
  local log="$LOGS/nvmf-host-identifier.log" id=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0
  timeout 60 "$NVMF_BIN" -a "$IP" -s $PORT -n "$NQN" --hostid "$id" \
    get-feature -f 0x81 --cdw11 1 -l 16 | tee "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] &&
    grep -q "^0000: 0f 1e 2d 3c 4b 5a 69 78 87 96 a5 b4 c3 d2 e1 f0" "$log"
}
# 2 MiB written and read back in 128 KiB commands through a 256 KiB shared data region (two
# largest transfers in flight, by the region, not the queue depth), over real verbs.
nvmf_shared_region() {
  local data="$LOGS/shared-region.data" back="$LOGS/shared-region.back"
  local nvmf=(timeout 60 "$NVMF_BIN" -a "$IP" -s $PORT -n "$NQN" --queue-data-size 256K)
  head -c 2097152 /dev/urandom > "$data" &&
    "${nvmf[@]}" write -s 2048 -c 4096 -d "$data" &&
    "${nvmf[@]}" read -s 2048 -c 4096 -d "$back" &&
    cmp "$data" "$back" &&
    "${nvmf[@]}" connect | tee "$LOGS/nvmf-connect-shared.log" &&
    grep -q "^queue_data  : 262144$" "$LOGS/nvmf-connect-shared.log"
}
# Write Zeroes, Dataset Management (deallocate) and Flush over real verbs: 64 blocks of 512 B
# written at LBA 8192, blocks 8196..8203 zeroed, 8220..8221 and 8230..8232 deallocated (null_blk
# with discard: deallocated sectors are freed and read as zeroes), then read back: exactly those
# blocks are zero, the others as written.
nvmf_block_commands() {
  local data="$LOGS/block-commands.data" back="$LOGS/block-commands.back"
  local nvmf=(timeout 60 "$NVMF_BIN" -a "$IP" -s $PORT -n "$NQN")
  head -c 32768 /dev/urandom > "$data" &&
    "${nvmf[@]}" write -s 8192 -c 64 -d "$data" &&
    "${nvmf[@]}" write-zeroes -s 8196 -c 8 | tee "$LOGS/block-commands.log" &&
    "${nvmf[@]}" dsm --ad --slbs 8220,8230 --blocks 2,3 | tee -a "$LOGS/block-commands.log" &&
    "${nvmf[@]}" flush | tee -a "$LOGS/block-commands.log" &&
    "${nvmf[@]}" read -s 8192 -c 64 -d "$back" &&
    compare_spans "$data" "$back" w:2048 z:4096 w:8192 z:1024 w:4096 z:1536 w:11776 &&
    grep -q "^write-zeroes: Success" "$LOGS/block-commands.log" &&
    grep -q "^dsm: Success (2 ranges" "$LOGS/block-commands.log" &&
    grep -q "^flush: Success" "$LOGS/block-commands.log"
}
# Per-I/O keys over real verbs: every command's data through its own type-2 memory window, which
# nvmet-rdma ends with SEND_WITH_INVALIDATE (so the host never has to invalidate one itself).
perf_per_io_keys() {
  local log="$LOGS/perf-per-io-keys.log"
  RUST_LOG=nvmf_initiator::rdma=debug timeout 60 "$PERF_BIN" -a "$IP" -s $PORT -n "$NQN" \
    -q 32 -o 4096 -w randrw -t 10 --verify --per-io-keys >"$log" 2>&1
  local rc=$?
  tail -5 "$log"
  [ "$rc" -eq 0 ] &&
    grep -q "memory windows for per-I/O keys" "$log" &&
    ! grep -q "no memory windows" "$log" &&
    ! grep -q "the host invalidates it" "$log"
}
perf_verify() {
  timeout 120 "$PERF_BIN" -a "$IP" -s $PORT -n "$NQN" -q 32 -o 4096 -w randrw -t 30 --qpairs 4 --verify
}

check "nvmet-rdma serves $NQN (null_blk 256 MiB, 512 B, any host) on $IP:$PORT" nvmet_up any
[ -x "$NVMF_BIN" ] || { echo "nvmf is not built (not in the workspace yet)"; SKIP_REASON="no nvmf binary"; }
check "nvmf discover lists $NQN" nvmf_discover
check "nvmf id-ctrl $NQN" nvmf_identify
check "nvmf show-regs -H: CAP, VS, CC and CSTS read live, the controller enabled and ready" nvmf_show_regs
check "nvmf get-feature 0x81 -l 16: nvmet returns the host identifier nvmf connected with" nvmf_host_identifier
check "nvmf write + read back 2 MiB through a 256 KiB shared queue data region" nvmf_shared_region
check "nvmf write-zeroes, dsm --ad and flush: exactly the named blocks read back as zeroes" nvmf_block_commands
SKIP_REASON=
[ -x "$PERF_BIN" ] || { echo "nvmf-perf is not built (not in the workspace yet)"; SKIP_REASON="no nvmf-perf binary"; }
check "nvmf-perf randrw 4 KiB QD32, 4 qpairs, 30 s, --verify" perf_verify
check "nvmf-perf --per-io-keys randrw 4 KiB QD32, 10 s, --verify: a window per I/O, each invalidated by nvmet-rdma" perf_per_io_keys
SKIP_REASON=
check "no qpair left on rxe0 (rdma res)" no_connections_left
check "nvmet configuration removed" nvmet_down
finish
