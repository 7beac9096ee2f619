#!/bin/bash
# Suite `faults` (guest): nvmf-tgt under abuse over rxe0, with the Linux host as the bystander
# that must keep being served: nvmf-perf killed mid-run, `nvme disconnect` under fio load,
# nvmf-tgt SIGTERM under load. After each: no qpair leaked (rdma res, and after the kill nvmf-tgt's
# own statistics: only the bystander's qpairs, every receive slot back), the target still serves.
# First, on an nvmf-tgt of its own: a target that never invalidates a host's per-I/O key.
SUITE=faults
. "$(dirname "$0")/guest-lib.sh"
. "$(dirname "$0")/suite-lib.sh"
. "$(dirname "$0")/nvmeof-lib.sh"
trap 'kill -KILL $LOAD $PERF 2>/dev/null; nvme disconnect -n "$NQN" >/dev/null 2>&1; [ -n "$TGT" ] && kill -KILL $TGT 2>/dev/null' EXIT
# The host gives up on a lost target after 10 s instead of reconnecting for 10 min.
HOST_OPTS=(--ctrl-loss-tmo=10 --reconnect-delay=1)

user_qps() { rdma res show qp | grep ' type RC ' | grep -c ' pid ' || true; }   # QPs of processes
# reads + writes completed on the nvme disks; the paths (nvmeXcYnZ) count them, the 6.1 multipath head does not
io_done() { cat /sys/block/nvme*/stat 2>/dev/null | awk '{ n += $1 + $5 } END { print n + 0 }'; }
io_started() { alive "$LOAD" || return 2; [ "$(io_done)" -gt "$1" ]; }
start_load() {   # fio random read/write on the Linux host until stopped; returns once I/O flows
  local before
  [ -b "$DEV" ] || { echo "no block device ($DEV)"; return 1; }
  before=$(io_done)
  fio --name=load --filename="$DEV" --rw=randrw --bs=4k --iodepth=32 --ioengine=libaio --direct=1 \
      --time_based --runtime=300 > "$LOGS/fio-load-$1.log" 2>&1 & LOAD=$!
  wait_for 60 io_started $((before + 500)) || { echo "fio did no I/O"; cat "$LOGS/fio-load-$1.log"; return 1; }
}
load_ends() {   # the load ends within SECS once its device went away (errors expected)
  wait_for "$1" gone "$LOAD" || { echo "fio still running"; kill -KILL "$LOAD"; return 1; }
  wait "$LOAD"; echo "fio exited $? (I/O errors expected)"; tail -3 "$LOGS/fio-load-$2.log"
}

perf_up() { alive "$PERF" || return 2; [ "$(user_qps)" -ge $(($1 + 10)) ]; }   # +5 QPs each side
perf_killed() {   # nvmf-perf killed -9 with I/O in flight: the target drops its 5 qpairs, no more
  local base; base=$(user_qps)
  "$PERF_BIN" -a "$IP" -s $PORT -n "$NQN" --hostnqn "$PERF_NQN" -q 32 -o 4096 -w randrw -t 300 \
      --qpairs 4 > "$LOGS/nvmf-perf.log" 2>&1 & PERF=$!
  wait_for 60 perf_up "$base" || { echo "nvmf-perf never had admin + 4 I/O qpairs up"; cat "$LOGS/nvmf-perf.log"; return 1; }
  echo "qpairs of processes: $base before nvmf-perf, $(user_qps) with it"
  kill -KILL "$PERF"; wait "$PERF"
  wait_for 30 eval '[ "$(user_qps)" -eq '"$base"' ]' || { echo "target still holds $(($(user_qps) - base)) of nvmf-perf's qpairs"; rdma res show qp; return 1; }
}
host_qps() { rdma res show qp | grep ' type RC ' | grep -vc ' pid ' || true; }   # the kernel host's QPs
slots_back() {   # nvmf-tgt's own statistics: as many qpairs as the Linux host holds, no receive slot held
  local n; n=$(host_qps)
  echo "the Linux host (the bystander) holds $n RC QPs; processes hold $(user_qps)"
  [ "$n" -gt 0 ] || { echo "the bystander holds no qpair"; rdma res show qp; return 1; }
  tgt_holds "$n"
}
# A target that leaves every per-I/O key valid (nvmf-tgt with remote_invalidate = false, started
# on its own first): nvmf-perf's host invalidates each window itself (LOCAL_INV on rxe) before it
# reports the command, the data verifies and its report counts them; then that nvmf-tgt exits 0
# on SIGTERM.
host_invalidates() {
  local config="$LOGS/nvmf-tgt-no-invalidate.toml" log="$LOGS/perf-host-invalidates.log" rc
  sed 's/^\[transport\]$/[transport]\nremote_invalidate = false/' "$LAB/nvmf-tgt.toml" > "$config" &&
    grep -q "^remote_invalidate = false$" "$config" || return
  "$TGT_BIN" --config "$config" > "$LOGS/nvmf-tgt-no-invalidate.log" 2>&1 & TGT=$!
  wait_for 60 tgt_listening || { cat "$LOGS/nvmf-tgt-no-invalidate.log"; return 1; }
  timeout 60 "$PERF_BIN" -a "$IP" -s $PORT -n "$NQN" \
    --hostnqn "$PERF_NQN" -q 32 -o 4096 -w randrw -t 10 --verify --per-io-keys > "$log" 2>&1
  rc=$?
  tail -6 "$log"
  local line="per-I/O keys the host invalidated itself (the target left them valid): "
  local count; count=$(grep -F "$line" "$log" | sed 's/.*: //')
  echo "windows the host invalidated: ${count:-none reported}"
  kill -TERM "$TGT" && wait_for 30 gone "$TGT" || { echo "nvmf-tgt still running"; return 1; }
  wait "$TGT" || { echo "nvmf-tgt exited $?"; return 1; }
  [ "$rc" -eq 0 ] && [ "${count:-0}" -gt 0 ]
}
disconnect_under_load() { start_load disconnect && host_disconnect && load_ends 60 disconnect; }
sigterm_under_load() { start_load sigterm && tgt_down; }
host_gives_up() {   # with the target gone the host ends the load, drops the controller, holds nothing
  load_ends 120 sigterm
  timeout 60 nvme disconnect -n "$NQN"
  wait_for 30 no_ctrl || { echo "a controller of $NQN is still there"; return 1; }
  wait_for 30 no_rc_qps || { rdma res show qp; return 1; }
  ! rdma res show cm_id | grep -q . || { rdma res show cm_id; return 1; }
}

[ -x "$TGT_BIN" ] || { echo "nvmf-tgt is not built (not in the workspace yet): every check skipped"
                       SKIP_REASON="no nvmf-tgt binary"; }
check "nvmf-perf --per-io-keys --verify against nvmf-tgt with remote_invalidate = false: the host invalidates every window itself" host_invalidates
check "nvmf-tgt --config tests/lab/nvmf-tgt.toml listens on $IP:$PORT" tgt_up
check "Linux host connected (the bystander)" host_connect "${HOST_OPTS[@]}"

[ -z "$SKIP_REASON" ] && [ ! -x "$PERF_BIN" ] && { echo "nvmf-perf is not built (not in the workspace yet)"; SKIP_REASON="no nvmf-perf binary"; }
check "nvmf-perf killed mid-run: the target frees exactly its qpairs" perf_killed
SKIP_REASON=; [ -x "$TGT_BIN" ] || SKIP_REASON="no nvmf-tgt binary"
check "SRQ slots all back after the kill: nvmf-tgt holds only the bystander's qpairs" slots_back
check "the bystander host is still served: fio write + verify" fio_verify "$DEV"

check "nvme disconnect under fio load: returns, the load ends" disconnect_under_load
check "no qpair left after that disconnect (rdma res)" no_connections_left
check "nvmf-tgt still serves: reconnect, fio write + verify" eval 'host_connect "${HOST_OPTS[@]}" && fio_verify "$DEV"'

check "nvmf-tgt SIGTERM under fio load: exits 0 within 30 s" sigterm_under_load
check "the host gives up on the stopped target: no controller, no qpair, no CM id" host_gives_up
finish
