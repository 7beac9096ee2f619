#!/bin/bash
# Guest script (by hand: tests/lab/run-guest.sh tests/lab/guest-queue-data-rss.sh, after
# `cargo build --release -p nvmf-initiator`): the nvmf CLI's peak RSS against nvmet-rdma over
# rxe0 with the default I/O queue data region (queue depth x largest transfer: 128 x 128 KiB,
# registered, so pinned and resident) and with --queue-data-size 1M and 256K; three rounds of
# a 2 MiB read each, then `connect` alone. Prints one line per run.
SUITE=queue-data-rss
. "$(dirname "$0")/guest-lib.sh"
. "$(dirname "$0")/suite-lib.sh"
. "$(dirname "$0")/nvmeof-lib.sh"
NVMF=$(cd "$LAB/../.." && pwd)/build/release/nvmf
[ -x "$NVMF" ] || { echo "no $NVMF: build it first"; exit 2; }
setup_net > /dev/null 2>&1 && setup_rxe > /dev/null 2>&1 || { echo "rxe0 set-up failed"; exit 1; }
trap 'nvmet_down' EXIT
nvmet_up any || { echo "nvmet-rdma set-up failed"; exit 1; }
for round in 1 2 3; do
  for size in default 1M 256K; do
    flag=(); [ "$size" = default ] || flag=(--queue-data-size "$size")
    /usr/bin/time -f "round $round, queue data $size: read 2 MiB, peak RSS %M KiB" \
      "$NVMF" -a "$IP" -s $PORT -n "$NQN" "${flag[@]}" read -s 0 -c 4096 -d "$LOGS/read.bin" 2>&1 |
      grep "peak RSS" || exit 1
  done
done
for flag in "" "--queue-data-size 256K"; do
  # shellcheck disable=SC2086
  /usr/bin/time -f "connect ${flag:-(default)}: peak RSS %M KiB" "$NVMF" -a "$IP" -s $PORT \
    -n "$NQN" $flag connect 2>&1 | grep -E "peak RSS|queue_data" || exit 1
done
