#!/bin/bash
# Suite `kernel-peers` (guest): the Linux kernel's own NVMe-oF target (nvmet-rdma) and host
# (nvme-rdma, nvme-cli) against each other over rxe0: the plumbing the kernel-host and
# kernel-target suites stand on, proven with the very checks kernel-host runs against nvmf-tgt.
SUITE=kernel-peers
. "$(dirname "$0")/guest-lib.sh"
. "$(dirname "$0")/suite-lib.sh"
. "$(dirname "$0")/nvmeof-lib.sh"
trap 'nvme disconnect -n "$NQN" >/dev/null 2>&1; nvmet_down' EXIT

check "nvmet-rdma serves $NQN (null_blk 256 MiB, 512 B, allow-list) on $IP:$PORT" nvmet_up allowlist &&
  kernel_host_checks nvmet-rdma
check "nvmet configuration removed" nvmet_down
finish
