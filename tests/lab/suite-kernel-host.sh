#!/bin/bash
# Suite `kernel-host` (guest): the Linux host (nvme-cli + nvme-rdma) against nvmf-tgt over rxe0:
# discovery, connect, identify, verified I/O, Write Zeroes and discard, a filesystem, disconnect,
# the host allow-list, and no qpair left behind (by rdma res and by nvmf-tgt's own statistics);
# then nvmf-tgt stops cleanly on SIGTERM. The checks of kernel-peers, and nvme-cli reading the
# firmware slot log and switching the volatile write cache off and on (which nvmet does not serve).
SUITE=kernel-host
. "$(dirname "$0")/guest-lib.sh"
. "$(dirname "$0")/suite-lib.sh"
. "$(dirname "$0")/nvmeof-lib.sh"
trap 'nvme disconnect -n "$NQN" >/dev/null 2>&1; [ -n "$TGT" ] && kill -KILL $TGT 2>/dev/null' EXIT

[ -x "$TGT_BIN" ] || { echo "nvmf-tgt is not built (not in the workspace yet): every check skipped"
                       SKIP_REASON="no nvmf-tgt binary"; }
check "nvmf-tgt --config tests/lab/nvmf-tgt.toml listens on $IP:$PORT" tgt_up &&
  kernel_host_checks nvmf-tgt tgt_idle
check "nvmf-tgt exits 0 on SIGTERM" tgt_down
finish
