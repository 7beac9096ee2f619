# NVMe-oF in the lab guest (sourced by suite-kernel-*.sh and suite-faults.sh after suite-lib.sh):
# the lab subsystem served by either target (the kernel's nvmet-rdma through configfs, or
# nvmf-tgt with tests/lab/nvmf-tgt.toml), and the Linux host's checks against whichever serves it.
# Both targets serve the same thing, so the same checks prove both: subsystem $NQN, namespace 1 of
# 256 MiB in 512 B blocks, hosts allowed by NQN, RDMA at $IP:4420.
NQN=nqn.2024-01.io.nvmf-rs:lab
PORT=4420
NS_BYTES=$((256 << 20)) NS_BLOCK=512
# Fixed host identities; each NQN gets its own host ID (the Linux host refuses one ID under two NQNs).
HOST_NQN=nqn.2024-01.io.nvmf-rs:lab-host        HOST_ID=6c61622d-0000-4000-8000-000000000001
PERF_NQN=nqn.2024-01.io.nvmf-rs:lab-perf        # nvmf-perf's, in the faults suite
INTRUDER_NQN=nqn.2024-01.io.nvmf-rs:lab-intruder INTRUDER_ID=6c61622d-0000-4000-8000-000000000002
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CFS=/sys/kernel/config/nvmet

# ---- target 1: the Linux kernel (nvmet-rdma), backed by a memory null_blk ----
# nvmet_up allowlist|any: $NQN on /dev/nullb0 with only $HOST_NQN (and $PERF_NQN) allowed, or any host.
nvmet_up() {
  modprobe null_blk nr_devices=0 && modprobe nvmet-rdma || return
  local nb=/sys/kernel/config/nullb/nullb0 s=$CFS/subsystems/$NQN h
  mkdir "$nb" && echo 256 > "$nb/size" && echo $NS_BLOCK > "$nb/blocksize" &&
    echo 1 > "$nb/memory_backed" && echo 1 > "$nb/discard" && echo 1 > "$nb/power" || return
  udevadm settle 2>/dev/null; wait_for 10 test -b /dev/nullb0 || return
  mkdir "$s" || return
  if [ "$1" = any ]; then echo 1 > "$s/attr_allow_any_host"; else
    echo 0 > "$s/attr_allow_any_host"
    for h in "$HOST_NQN" "$PERF_NQN"; do
      mkdir -p "$CFS/hosts/$h" && ln -s "$CFS/hosts/$h" "$s/allowed_hosts/$h" || return
    done
  fi
  mkdir "$s/namespaces/1" && echo -n /dev/nullb0 > "$s/namespaces/1/device_path" &&
    echo 1 > "$s/namespaces/1/enable" || return
  mkdir "$CFS/ports/1" && echo rdma > "$CFS/ports/1/addr_trtype" && echo ipv4 > "$CFS/ports/1/addr_adrfam" &&
    echo "$IP" > "$CFS/ports/1/addr_traddr" && echo $PORT > "$CFS/ports/1/addr_trsvcid" &&
    ln -s "$s" "$CFS/ports/1/subsystems/$NQN" || return
  wait_for 10 listening "$IP:$PORT"
}
nvmet_down() {   # undo nvmet_up (whatever part of it happened)
  local s=$CFS/subsystems/$NQN h
  rm -f "$CFS/ports/1/subsystems/$NQN"; rmdir "$CFS/ports/1" 2>/dev/null
  [ -d "$s" ] && { echo 0 > "$s/namespaces/1/enable"; rmdir "$s/namespaces/1"; }
  for h in "$HOST_NQN" "$PERF_NQN"; do rm -f "$s/allowed_hosts/$h"; rmdir "$CFS/hosts/$h" 2>/dev/null; done
  rmdir "$s" 2>/dev/null
  rmdir /sys/kernel/config/nullb/nullb0 2>/dev/null
  [ ! -e "$s" ] && [ ! -e /dev/nullb0 ]
}

# ---- target 2: nvmf-tgt ($TGT_BIN) with the lab config ----
tgt_up() {   # starts nvmf-tgt in the background ($TGT), waits until it listens
  "$TGT_BIN" --config "$LAB/nvmf-tgt.toml" > "$LOGS/nvmf-tgt.log" 2>&1 & TGT=$!
  wait_for 60 tgt_listening || { echo "nvmf-tgt is not listening on $IP:$PORT:"; cat "$LOGS/nvmf-tgt.log"; return 1; }
}
tgt_listening() {   # fails at once (2) when the daemon has exited
  alive "$TGT" || { echo "nvmf-tgt exited"; return 2; }
  listening "$IP:$PORT"
}
# nvmf-tgt's own view, from its statistics file ([daemon] stats_file in nvmf-tgt.toml; fields in
# configs/README.md): SIGUSR1 makes it write a snapshot collected after the signal, which
# counts it in .signals.
TGT_STATS=/tmp/nvmf-tgt-stats.json
stats_signals() { jq -r '.signals // 0' "$TGT_STATS" 2>/dev/null || echo 0; }
tgt_stats() {   # SIGUSR1, then waits for the snapshot taken after it; fails (2) when none comes
  local before; before=$(stats_signals)
  kill -USR1 "$TGT" 2>/dev/null || { echo "nvmf-tgt is not running"; return 2; }
  wait_for 10 eval '[ "$(stats_signals)" -gt '"$before"' ]' || { echo "$TGT_STATS not rewritten after SIGUSR1"; return 2; }
}
tgt_settled() {   # tgt_settled N: a fresh snapshot shows N qpairs in all and no receive slot held
  tgt_stats || return
  jq -e --argjson n "$1" '.qpairs == $n and .recv_slots_held == 0' "$TGT_STATS" > /dev/null
}
tgt_holds() {   # tgt_holds N: nvmf-tgt settles on N qpairs with every receive slot back (within 30 s)
  wait_for 30 tgt_settled "$1"; local rc=$?
  jq '{sequence, signals, qpairs, recv_slots_held, groups: [.reactors[].groups[] | {device_name, qpairs,
      recv_slots, requests, errors: (.counters | {recv_slot_errors, stale_completions, kind_mismatches, overruns})}]}' \
    "$TGT_STATS"
  [ $rc -eq 0 ] || echo "nvmf-tgt's statistics never showed $1 qpair(s) with no receive slot held"
  return $rc
}
tgt_idle() { tgt_holds 0; }   # no qpair left, every receive slot back
tgt_down() {   # SIGTERM: the daemon must drain and exit 0 within 30 s
  local rc
  kill -TERM "$TGT" || return
  wait_for 30 gone "$TGT" || { echo "nvmf-tgt still running 30 s after SIGTERM"; kill -KILL "$TGT"; return 1; }
  wait "$TGT"; rc=$?
  echo "nvmf-tgt exited $rc"; tail -5 "$LOGS/nvmf-tgt.log"
  [ $rc -eq 0 ]
}

# ---- the Linux host (nvme-cli, nvme-rdma) ----
connect() {   # connect NQN ID [nvme connect args...]
  local nqn=$1 id=$2; shift 2
  modprobe nvme-rdma || return
  timeout 60 nvme connect -t rdma -a "$IP" -s $PORT -n "$NQN" --hostnqn="$nqn" --hostid="$id" --nr-io-queues=2 "$@"
}
ctrl_of() {   # the /dev/nvmeN controller connected to $NQN as host $1
  local c
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$NQN" ] && [ "$(cat "$c/hostnqn" 2>/dev/null)" = "$1" ] &&
      { echo "/dev/${c##*/}"; return 0; }
  done
  return 1
}
host_connect() {   # connects $HOST_NQN; sets CTRL and DEV (the namespace's block device)
  CTRL= DEV=
  connect "$HOST_NQN" "$HOST_ID" "$@" || return
  CTRL=$(ctrl_of "$HOST_NQN") || { echo "connected, but no controller for $NQN"; return 1; }
  wait_for 20 eval 'DEV=$(nvme_dev) && [ -b "$DEV" ]' || { echo "no block device for $NQN"; return 1; }
  echo "controller $CTRL, namespace $DEV"
}
host_disconnect() {   # disconnects every controller of $NQN; they and their block device vanish
  timeout 60 nvme disconnect -n "$NQN" | tee /dev/stderr | grep -q "disconnected [1-9]" || return
  wait_for 20 no_ctrl || { echo "a controller of $NQN is still there"; return 1; }
  [ -z "$DEV" ] || [ ! -b "$DEV" ] || { echo "$DEV still exists"; return 1; }
}
no_ctrl() { ! grep -qsx "$NQN" /sys/class/nvme/*/subsysnqn; }
discover() {   # the discovery log holds an entry for $NQN at rdma $IP:$PORT
  modprobe nvme-rdma || return   # nvme-cli needs /sys/class/nvme* (nvme_core) to exist
  timeout 60 nvme discover -t rdma -a "$IP" -s $PORT --hostnqn="$HOST_NQN" --hostid="$HOST_ID" -o json \
    > "$LOGS/discover.json" || return
  cat "$LOGS/discover.json"
  jq -e --arg nqn "$NQN" --arg ip "$IP" --arg port $PORT '[.records[] | select(.subnqn == $nqn
    and .trtype == "rdma" and .traddr == $ip and (.trsvcid | tostring) == $port)] | length == 1' \
    "$LOGS/discover.json"
}
identify() {   # the controller's subsystem NQN and the namespace's geometry are what was configured
  local subnqn nsze ds bytes
  subnqn=$(nvme id-ctrl "$CTRL" -o json | jq -r .subnqn) || return
  nsze=$(nvme id-ns "$DEV" -o json | jq -r .nsze) || return
  ds=$(nvme id-ns "$DEV" -o json | jq -r '.lbafs[.flbas % 16].ds') || return
  bytes=$(blockdev --getsize64 "$DEV") || return
  echo "subnqn=$subnqn nsze=$nsze lba=$((1 << ds)) B block device=$bytes B"
  [ "$subnqn" = "$NQN" ] && [ $((1 << ds)) -eq $NS_BLOCK ] && [ $((nsze * NS_BLOCK)) -eq $NS_BYTES ] &&
    [ "$bytes" -eq $NS_BYTES ]
}
# nvmf-tgt only (nvmet answers a zeroed firmware log and refuses Volatile Write Cache changes):
# the firmware slot log names slot 1 active with Identify's FR, and the volatile write cache
# goes off and on again through nvme-cli (get-feature prints the value in hex or in octal-looking
# zero-padded digits, both of which the shell's arithmetic reads).
fw_log_and_write_cache() {
  local fr log="$LOGS/fw-log.bin" afi frs1 v got
  fr=$(nvme id-ctrl "$CTRL" -o json | jq -r .fr | sed 's/ *$//') || return
  nvme fw-log "$CTRL" -b > "$log" || return
  afi=$(od -An -tu1 -N1 "$log" | tr -d ' ')
  frs1=$(dd if="$log" bs=1 skip=8 count=8 status=none | tr -d ' \0')
  echo "identify fr '$fr'; firmware log afi $afi, frs1 '$frs1'"
  [ "$afi" = 1 ] && [ -n "$fr" ] && [ "$frs1" = "$fr" ] || return
  for v in 0 1; do
    nvme set-feature "$CTRL" -f 6 -v $v || return
    got=$(nvme get-feature "$CTRL" -f 6 | sed -n 's/.*value: *//p')
    echo "volatile write cache set to $v, read back '$got'"
    [ -n "$got" ] && [ $((got)) -eq $v ] || return
  done
}
# Get Features Host Identifier (0x81, EXHID): the 16 bytes nvme connect gave as --hostid.
host_identifier() {
  local got want
  got=$(nvme get-feature "$CTRL" -f 0x81 --cdw11=1 -l 16 -b | od -An -tx1 | tr -d ' \n') || return
  want=${HOST_ID//-/}
  echo "host identifier read back $got, connected as $want"
  [ "$got" = "$want" ]
}
fio_verify() {   # fio_verify DEV: written data reads back intact (random 4 KiB at QD 32, sequential 128 KiB)
  timeout 600 fio --ioengine=libaio --direct=1 --filename="$1" --verify=crc32c --verify_fatal=1 \
    --name=rand4k --rw=randwrite --bs=4k --iodepth=32 --offset=0 --size=32M \
    --name=seq128k --rw=write --bs=128k --iodepth=8 --offset=64M --size=64M
}
# compare_spans WRITTEN BACK SPAN...: BACK, read back after WRITTEN was written, holds in order
# each SPAN's bytes: w:N, N bytes as written; z:N, N zero bytes.
compare_spans() {
  local data=$1 back=$2 at=0 len kind span
  shift 2
  for span in "$@"; do
    kind=${span%%:*} len=${span#*:}
    if [ "$kind" = w ]; then cmp -n "$len" -i "$at:$at" "$data" "$back" || return
    else cmp -n "$len" -i "$at:0" "$back" /dev/zero || return; fi
    at=$((at + len))
  done
  [ "$at" -eq "$(stat -c %s "$back")" ] || { echo "spans cover $at bytes of $(stat -c %s "$back")"; return 1; }
}
# The kernel's Write Zeroes (blkdiscard -z: BLKZEROOUT, no unmap) and discard (blkdiscard: Dataset
# Management deallocate) on 256 KiB written at 200 MiB: bytes 16..48 KiB and 128..192 KiB read back
# as zeroes, the rest as written. The queue limits say the host sends the commands themselves
# (without Write Zeroes the kernel would write zero pages instead).
zero_discard() {
  local data="$LOGS/zero-discard.data" back="$LOGS/zero-discard.back" base=$((200 << 20))
  local queue=/sys/block/${DEV##*/}/queue
  echo "write_zeroes_max_bytes=$(cat $queue/write_zeroes_max_bytes) discard_max_bytes=$(cat $queue/discard_max_bytes)"
  [ "$(cat $queue/write_zeroes_max_bytes)" -gt 0 ] && [ "$(cat $queue/discard_max_bytes)" -gt 0 ] || return
  head -c 262144 /dev/urandom > "$data" &&
    dd if="$data" of="$DEV" bs=64k seek=$((base >> 16)) oflag=direct conv=fsync status=none &&
    blkdiscard -z -o $((base + 16384)) -l 32768 "$DEV" &&
    blkdiscard -o $((base + 131072)) -l 65536 "$DEV" &&
    dd if="$DEV" of="$back" bs=64k skip=$((base >> 16)) count=4 iflag=direct status=none &&
    compare_spans "$data" "$back" w:16384 z:32768 w:81920 z:65536 w:65536
}
fs_roundtrip() {   # ext4 on the namespace: a file written, unmounted, mounted again reads back the same
  local m=/tmp/lab-mnt a b
  mkdir -p $m && mkfs.ext4 -q -F "$DEV" && mount "$DEV" $m || return
  head -c $((8 << 20)) /dev/urandom > $m/data && a=$(sha256sum < $m/data) && umount $m || return
  echo 3 > /proc/sys/vm/drop_caches
  mount "$DEV" $m && b=$(sha256sum < $m/data) && umount $m || return
  echo "written $a"; echo "read    $b"; [ "$a" = "$b" ]
}
refused() {   # a host not on the allow-list: refused by the target (Connect Invalid Host), no controller
  local mark; mark="lab: intruder $(date +%s%N)"; echo "$mark" > /dev/kmsg
  connect "$INTRUDER_NQN" "$INTRUDER_ID" && { echo "connect succeeded for $INTRUDER_NQN"; return 1; }
  ! ctrl_of "$INTRUDER_NQN" || { echo "a controller exists for $INTRUDER_NQN"; return 1; }
  dmesg | sed -n "/$mark/,\$p" | tee /dev/stderr | grep -q "is not allowed, hostnqn: $INTRUDER_NQN"
}
no_connections_left() {   # no RC QP on rxe0 and no connected CM id: the listener only
  wait_for 30 no_rc_qps || { rdma res show qp; return 1; }
  ! rdma res show cm_id | grep -v 'state LISTEN' | grep -q . || { rdma res show cm_id; return 1; }
}

# The Linux host against whichever target serves $NQN now (nvmet_up allowlist, or tgt_up).
# kernel_host_checks WHO [IDLE]: IDLE, when given, checks the target's own view that no qpair is left.
kernel_host_checks() {
  local who=$1 idle=${2:-}
  check "nvme discover: $who reports $NQN over rdma at $IP:$PORT" discover
  check "nvme connect as $HOST_NQN to $who" host_connect
  check "nvme id-ctrl / id-ns: subnqn $NQN, 256 MiB in 512 B blocks" identify
  check "nvme get-feature 0x81: the host identifier nvme connect gave, 16 bytes of data" host_identifier
  [ "$who" != nvmf-tgt ] ||
    check "nvme fw-log: slot 1 holds nvmf-tgt's version; set-feature 6: the write cache off and on again" fw_log_and_write_cache
  check "fio write + crc32c verify (4 KiB random QD32, 128 KiB sequential)" fio_verify "$DEV"
  check "blkdiscard -z (Write Zeroes) and blkdiscard (deallocate): exactly those bytes read back as zeroes" zero_discard
  check "mkfs.ext4 + mount: a file reads back intact after remount" fs_roundtrip
  check "nvme disconnect: controller and block device gone" host_disconnect
  check "no qpair left after disconnect (rdma res)" no_connections_left
  [ -z "$idle" ] || check "no qpair left after disconnect ($who's statistics: 0 qpairs, 0 receive slots held)" "$idle"
  check "allow-list: $INTRUDER_NQN refused with Connect Invalid Host" refused
  check "no qpair left after the refusal" no_connections_left
}
