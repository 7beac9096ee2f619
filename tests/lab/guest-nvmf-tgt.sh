#!/bin/bash
# Guest script: our nvmf-tgt (verbs provider on Soft-RoCE rxe0) + the Linux kernel host
# (nvme-rdma), loopback: discover, connect, data verify (sha256 over the fabric), short fio,
# disconnect, SIGTERM.
# Run: tests/lab/run-guest.sh tests/lab/guest-nvmf-tgt.sh   (after `cargo build -p nvmf-target`)
. "$(dirname "$0")/guest-lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TGT=${TGT:-$ROOT/build/debug/nvmf-tgt}
NQN=nqn.2016-06.io.nvmf-rs:lab
step "network: netdev $NETDEV $IP mtu $MTU"; setup_net
step "rdma_rxe"; setup_rxe || exit 1
step "nvmf-tgt: verbs on $IP:4420, malloc 256 MiB"
cat > /root/nvmf-tgt.toml <<TOML
[reactors]
cores = [0, 1]
[transport]
provider = "verbs"
listen = ["$IP:4420"]
srq_depth = 1024
data_buffers = 512
[[bdev]]
name = "m0"
kind = "malloc"
size = 268435456
block_size = 512
[[subsystem]]
nqn = "$NQN"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
bdev = "m0"
TOML
"$TGT" --config /root/nvmf-tgt.toml > /root/nvmf-tgt.log 2>&1 &
TPID=$!
# Start-up is slow under TCG: wait for the daemon to say it serves.
for i in $(seq 300); do grep -q "nvmf-tgt running" /root/nvmf-tgt.log && break; sleep 0.2; done
tail -3 /root/nvmf-tgt.log
rc=1
(
  step "host: modprobe nvme-rdma; nvme discover"
  run modprobe nvme-rdma
  timeout 60 nvme discover -t rdma -a "$IP" -s 4420 || exit 1
  step "host: nvme connect"
  timeout 60 nvme connect -t rdma -n "$NQN" -a "$IP" -s 4420 || exit 1
  for i in $(seq 50); do dev=$(nvme_dev) && [ -b "$dev" ] && break; sleep 0.2; done
  [ -b "$dev" ] || { echo "no nvme block device appeared"; exit 1; }
  run nvme list
  step "data verify: 32 MiB random at offset 64 MiB, read back over the fabric"
  head -c 33554432 /dev/urandom > /tmp/pattern
  dd if=/tmp/pattern of="$dev" bs=1M seek=64 oflag=direct 2>&1 | tail -1
  echo 3 > /proc/sys/vm/drop_caches
  a=$(sha256sum < /tmp/pattern | cut -c1-16)
  b=$(dd if="$dev" bs=1M skip=64 count=32 iflag=direct 2>/dev/null | sha256sum | cut -c1-16)
  echo "written=$a read-back=$b => $([ "$a" = "$b" ] && echo VERIFY_OK || echo VERIFY_FAIL)"
  [ "$a" = "$b" ] || exit 1
  step "fio rand read 4k qd32 5s"; fio_job randread "$dev" randread 4k 32 5
  step "fio rand write 4k qd32 5s"; fio_job randwrite "$dev" randwrite 4k 32 5
  step "host: nvme disconnect"
  run timeout 60 nvme disconnect -n "$NQN"
) && rc=0
step "nvmf-tgt: SIGTERM"
kill -TERM "$TPID"; wait "$TPID"; echo "nvmf-tgt exit $?"
tail -20 /root/nvmf-tgt.log
step "done rc=$rc"; dmesg | grep -iE 'nvme|rxe' | tail -20
exit $rc
