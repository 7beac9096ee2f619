#!/usr/bin/env bash
# The main job, end to end, on the soft RDMA provider (no RDMA hardware needed):
#   build (release) -> start nvmf-tgt with configs/demo.toml (soft RDMA over TCP on 127.0.0.1)
#   -> nvmf discover -> nvmf id-ctrl and list -> a verified randrw load with nvmf-perf
#   -> the summary -> stop the target with SIGTERM and check it exits 0.
# Any failing step fails the script (non-zero exit) with the target's log shown.
#
# Knobs: NVMF_DEMO_PORT (default 4420, the config's port), NVMF_DEMO_SECONDS (default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

PORT=${NVMF_DEMO_PORT:-4420}
SECONDS_LOAD=${NVMF_DEMO_SECONDS:-10}
NQN=nqn.2016-06.io.nvmf-rs:demo
# The malloc namespace keeps data; nsid 2 is a null bdev (reads zeroes), which --verify cannot pass.
VERIFY_NSID=1

echo "== building nvmf-tgt, nvmf and nvmf-perf (release) =="
cargo build --release -q -p nvmf-target --bin nvmf-tgt
cargo build --release -q -p nvmf-initiator --bin nvmf --bin nvmf-perf
BIN=build/release

WORK=$(mktemp -d)
LOG="$WORK/nvmf-tgt.log"
CONFIG="$WORK/demo.toml"
sed "s/127\.0\.0\.1:4420/127.0.0.1:$PORT/" configs/demo.toml >"$CONFIG"
TGT=
cleanup() {
  if [ -n "$TGT" ] && kill -0 "$TGT" 2>/dev/null; then kill -TERM "$TGT" 2>/dev/null || true; wait "$TGT" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "== demo FAILED: $* ==" >&2
  echo "-- nvmf-tgt log (last 40 lines):" >&2
  tail -n 40 "$LOG" >&2 || true
  exit 1
}

echo "== nvmf-tgt --config configs/demo.toml (soft RDMA over TCP, 127.0.0.1:$PORT) =="
"$BIN/nvmf-tgt" --config "$CONFIG" --check
NO_COLOR=1 RUST_LOG=${RUST_LOG:-info} "$BIN/nvmf-tgt" --config "$CONFIG" >"$LOG" 2>&1 &
TGT=$!
for _ in $(seq 100); do
  grep -q "nvmf-tgt running" "$LOG" && break
  kill -0 "$TGT" 2>/dev/null || fail "nvmf-tgt exited at start"
  sleep 0.1
done
grep -q "nvmf-tgt running" "$LOG" || fail "nvmf-tgt did not come up within 10 s"

HOST=(--transport soft-tcp -a 127.0.0.1 -s "$PORT")
echo "== nvmf discover =="
"$BIN/nvmf" "${HOST[@]}" discover | tee "$WORK/discover" || fail "discover"
grep -q "subnqn: *$NQN" "$WORK/discover" || fail "discovery log does not list $NQN"
echo "== nvmf id-ctrl (first lines) =="
"$BIN/nvmf" "${HOST[@]}" -n "$NQN" id-ctrl >"$WORK/id-ctrl" || fail "id-ctrl"
head -n 12 "$WORK/id-ctrl"
echo "== nvmf list =="
"$BIN/nvmf" "${HOST[@]}" -n "$NQN" list || fail "list"

# --no-pin: the target's reactors already busy-poll cores 0 and 1; a host reactor pinned onto one
# of them shares it with a busy poller (about 7x fewer IOPS on a 2-core machine).
echo "== nvmf-perf -q 32 -o 4096 -w randrw -t $SECONDS_LOAD --verify --no-pin (nsid $VERIFY_NSID) =="
"$BIN/nvmf-perf" "${HOST[@]}" -n "$NQN" -q 32 -o 4096 -w randrw -t "$SECONDS_LOAD" --verify \
  --no-pin --nsid "$VERIFY_NSID" | tee "$WORK/perf" || fail "nvmf-perf"

echo "== stopping nvmf-tgt (SIGTERM) =="
kill -TERM "$TGT"
set +e
wait "$TGT"
RC=$?
set -e
TGT=
[ "$RC" -eq 0 ] || fail "nvmf-tgt exited with status $RC"
grep -E "stopped" "$LOG" | tail -n 1 | sed 's/^.*INFO *//'

echo "== summary =="
echo "target:    nvmf-tgt, configs/demo.toml, soft RDMA over TCP on 127.0.0.1:$PORT"
echo "discovery: $(grep -c '^subnqn:' "$WORK/discover") record(s), $NQN listed"
echo "identify:  $(grep -E '^(sn|mn) ' "$WORK/id-ctrl" | sed -E 's/ +: /=/; s/ +$//' | paste -sd' ')"
echo "load:      $(grep -E '^Total' "$WORK/perf" | awk '{printf "%s IOPS, %s MiB/s, avg %s us, p99 %s us", $2, $3, $4, $8}')"
echo "verify:    $(grep -E '^errors:' "$WORK/perf")"
echo "shutdown:  nvmf-tgt exited 0 on SIGTERM"
echo "== demo done =="
