#!/bin/bash
# Suite `bench` (guest; `scripts/interop.sh bench`, not part of `all`): the Linux host (nvme-cli +
# nvme-rdma + fio) against nvmf-tgt (verbs provider on rxe0) and against the kernel's nvmet-rdma,
# one after the other in the same boot, A B A B... for BENCH_REPS rounds, each serving the lab
# subsystem (256 MiB, 512 B blocks) from memory: nvmf-tgt a malloc bdev, nvmet-rdma a null_blk with
# memory_backed=1. Per target and round: fio 4 KiB randread QD 32, 4 KiB randread QD 1, 128 KiB
# sequential read QD 16 (BENCH_RUNTIME s each after a 2 s ramp, direct, libaio) over the first
# 64 MiB of the namespace, written just before. fio runs on guest CPU 0; nvmf-tgt (its one
# reactor and every other thread) on CPU 1; the kernel target runs wherever the kernel puts its
# work. Each job's per-CPU busy share is measured from /proc/stat.
# Prints a markdown table (medians over the rounds, ratio ours / kernel) and writes it with every
# run to /results/bench.json and /results/bench.md. The figures are not checks (the guest is fully
# emulated: only the ratio within one run means anything); the checks are that each step ran.
SUITE=bench
. "$(dirname "$0")/guest-lib.sh"
. "$(dirname "$0")/suite-lib.sh"
. "$(dirname "$0")/nvmeof-lib.sh"
trap 'nvme disconnect -n "$NQN" >/dev/null 2>&1; [ -n "$TGT" ] && kill -KILL $TGT 2>/dev/null; nvmet_down >/dev/null 2>&1' EXIT

# A measurement needs the optimised build (interop.sh builds it for this suite), never the debug one.
BENCH_TGT=${TGT_RELEASE_BIN:-}
REPS=${BENCH_REPS:-3} RUNTIME=${BENCH_RUNTIME:-20} RAMP=2
SPAN=64M                 # the part of the namespace fio reads (written first, so reads copy data)
# nvmf-tgt's CPU: 1 (nvmf-tgt-bench.toml's reactor core); BENCH_TGT_CPU=0 puts it beside fio, to
# see what crossing CPUs costs in the emulated guest.
FIO_CPU=0 TGT_CPU=${BENCH_TGT_CPU:-1}
JOBS=("randread-4k-qd32 randread 4k 32" "randread-4k-qd1 randread 4k 1" "read-128k-qd16 read 128k 16")
OURS=nvmf-tgt KERNEL=nvmet-rdma
RUNS=$LOGS/runs.jsonl
: > "$RUNS"

# Whole-machine CPU accounting: "cpuN busy idle" in clock ticks, per CPU.
cpu_ticks() { awk '/^cpu[0-9]/ { print $1, $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat; }
proc_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }   # utime + stime
STATS=/tmp/nvmf-tgt-bench-stats.json   # [daemon] stats_file in nvmf-tgt-bench.toml (every 500 ms)
reactor_stats() { jq -c '.reactors[0] | {polls, busy_ms, sleeps}' "$STATS" 2>/dev/null || echo null; }
busy_shares() {   # busy_shares BEFORE AFTER: a JSON array of each CPU's busy share (%) in between
  join <(echo "$1") <(echo "$2") | awk '{ b = $4 - $2; i = $5 - $3; printf "%s%.0f", (NR > 1 ? "," : "["), (b + i > 0 ? 100 * b / (b + i) : 0) } END { print "]" }'
}

# nvmf-tgt with the bench config, every thread on $TGT_CPU (the reactor pins itself there too).
bench_tgt_up() {
  sed "s/^cores = \[1\]\$/cores = [$TGT_CPU]/" "$LAB/nvmf-tgt-bench.toml" > /tmp/nvmf-tgt-bench.toml &&
    grep -qx "cores = \[$TGT_CPU\]" /tmp/nvmf-tgt-bench.toml || { echo "no 'cores = [1]' line to move"; return 1; }
  rm -f "$STATS"   # a previous round's figures must not be read as this daemon's
  taskset -c $TGT_CPU "$BENCH_TGT" --config /tmp/nvmf-tgt-bench.toml >> "$LOGS/nvmf-tgt.log" 2>&1 & TGT=$!
  wait_for 60 tgt_listening || { echo "nvmf-tgt is not listening on $IP:$PORT:"; tail -20 "$LOGS/nvmf-tgt.log"; return 1; }
}

fill() {   # writes the span fio reads, so both targets copy real data on every read
  taskset -c $FIO_CPU timeout 300 fio --name=fill --filename="$DEV" --rw=write --bs=128k --iodepth=16 \
    --direct=1 --ioengine=libaio --size=$SPAN
}

# bench_job TARGET ROUND NAME RW BS QD: one fio job; appends its figures to $RUNS. Passes when
# fio exits 0, reports no error and a non-zero IOPS.
bench_job() {
  local target=$1 round=$2 name=$3 rw=$4 bs=$5 qd=$6 out rc before after t0 t1 r0 r1 wall record
  out=$LOGS/$target-$round-$name.json
  before=$(cpu_ticks); t0=$(proc_ticks "${TGT:-0}"); wall=$(cut -d' ' -f1 /proc/uptime)
  r0=$([ "$target" = $OURS ] && reactor_stats || echo null)
  taskset -c $FIO_CPU timeout $((RUNTIME + RAMP + 120)) fio --name="$name" --filename="$DEV" \
    --rw="$rw" --bs="$bs" --iodepth="$qd" --direct=1 --ioengine=libaio --size=$SPAN --time_based \
    --runtime="$RUNTIME" --ramp_time=$RAMP --output-format=json --output="$out"
  rc=$?
  after=$(cpu_ticks); t1=$(proc_ticks "${TGT:-0}")
  r1=$([ "$target" = $OURS ] && reactor_stats || echo null)
  wall=$(awk -v t0="$wall" '{ printf "%.2f", $1 - t0 }' /proc/uptime)
  [ $rc -eq 0 ] || { echo "fio exited $rc"; return 1; }
  # The target's own CPU time is only known for nvmf-tgt (nvmet-rdma is kernel work on any CPU).
  record=$(jq -c --arg target "$target" --argjson round "$round" --arg job "$name" --arg rw "$rw" \
    --arg bs "$bs" --argjson qd "$qd" --argjson cpu "$(busy_shares "$before" "$after")" \
    --argjson r0 "$r0" --argjson r1 "$r1" --argjson wall "$wall" --argjson tgt_cpu "$([ "$target" = $OURS ] && echo "100 * ($t1 - $t0) / $(getconf CLK_TCK) / $wall" | bc || echo null)" \
    '.jobs[0] as $j | {target: $target, round: $round, job: $job, rw: $rw, bs: $bs, qd: $qd,
      error: $j.error, iops: $j.read.iops, bw_kib: $j.read.bw, lat_avg_us: ($j.read.lat_ns.mean / 1000),
      lat_p99_us: (($j.read.clat_ns.percentile["99.000000"] // 0) / 1000),
      cpu_busy_pct: $cpu, nvmf_tgt_cpu_pct: $tgt_cpu,
      reactor: (if $r0 == null or $r1 == null then null else {busy_pct: (($r1.busy_ms - $r0.busy_ms) / 10 / $wall | round),
        sleeps: ($r1.sleeps - $r0.sleeps), polls: ($r1.polls - $r0.polls)} end)}' "$out") || { echo "fio's JSON has no read figures"; return 1; }
  echo "$record" | tee -a "$RUNS"
  jq -e '.error == 0 and .iops > 0' <<< "$record" > /dev/null
}

round_against() {   # round_against TARGET ROUND: connect, fill, every job, disconnect
  local target=$1 round=$2 job
  check "round $round, $target: nvme connect as $HOST_NQN" host_connect || return
  check "round $round, $target: fio writes the first $SPAN" fill
  for job in "${JOBS[@]}"; do
    # shellcheck disable=SC2086 # a job is "name rw bs qd"
    set -- $job
    check "round $round, $target: fio $1 for ${RUNTIME}s exits 0 with non-zero IOPS" bench_job "$target" "$round" "$@"
  done
  check "round $round, $target: nvme disconnect: controller and block device gone" host_disconnect &&
    check "round $round, $target: no qpair left after disconnect (rdma res)" no_connections_left
}

# ---- the rounds ----
check "the guest has at least 2 CPUs (fio on CPU $FIO_CPU, nvmf-tgt on CPU $TGT_CPU)" test "$(nproc)" -ge 2 -a "$TGT_CPU" -lt "$(nproc)" || { finish; exit; }
echo "nvmf-tgt: ${BENCH_TGT:-not built}"
echo "guest: $(nproc) CPUs; fio pinned to CPU $FIO_CPU; nvmf-tgt (one reactor, all threads) pinned to CPU $TGT_CPU;"
echo "nvmet-rdma: kernel work, not pinned (any CPU); $REPS rounds of ${RUNTIME}s per job after a ${RAMP}s ramp"
for round in $(seq 1 "$REPS"); do
  [ -x "$BENCH_TGT" ] || SKIP_REASON="no release build of nvmf-tgt"
  TGT=
  check "round $round, $OURS: starts with nvmf-tgt-bench.toml (reactor on CPU $TGT_CPU), listens on $IP:$PORT" bench_tgt_up &&
    round_against $OURS "$round"
  check "round $round, $OURS: exits 0 on SIGTERM" tgt_down
  SKIP_REASON= TGT=
  check "round $round, $KERNEL: up on a memory-backed null_blk (256 MiB, 512 B blocks)" nvmet_up allowlist &&
    round_against $KERNEL "$round"
  check "round $round, $KERNEL: torn down" nvmet_down
done

# ---- the table: medians over the rounds, ratio ours / kernel ----
job_names() { local job; for job in "${JOBS[@]}"; do echo "${job%% *}"; done | jq -R . | jq -sc .; }
summarize() {
  jq -s --arg ours $OURS --arg kernel $KERNEL --argjson reps "$REPS" --argjson runtime "$RUNTIME" \
    --argjson ramp $RAMP --argjson cpus "$(nproc)" --arg fio_cpu $FIO_CPU --arg tgt_cpu $TGT_CPU \
    --argjson order "$(job_names)" '
    def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
      else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    def ratio(a; b): if a == null or b == null or b == 0 then null else a / b end;
    . as $runs
    | {setup: {guest_cpus: $cpus, fio_cpu: $fio_cpu, nvmf_tgt_cpu: $tgt_cpu, nvmet_rdma_cpus: "any (kernel work)",
        rounds: $reps, runtime_s: $runtime, ramp_s: $ramp, ioengine: "libaio", direct: true, span: "64 MiB",
        namespace: "256 MiB, 512 B blocks; nvmf-tgt: malloc bdev; nvmet-rdma: null_blk memory_backed=1",
        transport: "RDMA over rdma_rxe (Soft-RoCE) on a dummy netdev, host and target in one TCG guest"},
       summary: [$runs | group_by(.job) | sort_by(.[0].job as $j | $order | index($j))[] | . as $g | ($g[0] | {job, rw, bs, qd}) + (
         [$ours, $kernel] | map(. as $t | {key: $t, value: ($g | map(select(.target == $t)) | {
           iops: (map(.iops) | median), lat_avg_us: (map(.lat_avg_us) | median),
           lat_p99_us: (map(.lat_p99_us) | median), rounds: length,
           cpu_busy_pct: (map(.cpu_busy_pct) | transpose | map(median)),
           nvmf_tgt_cpu_pct: (map(.nvmf_tgt_cpu_pct // empty) | median),
           reactor_busy_pct: (map(.reactor.busy_pct // empty) | median),
           reactor_sleeps_per_1k_io: (map(select(.reactor != null) | 1000 * .reactor.sleeps / (.iops * ($runtime + $ramp))) | median)})})
           | from_entries) as $by
         | {($ours): $by[$ours], ($kernel): $by[$kernel],
            iops_ratio: ratio($by[$ours].iops; $by[$kernel].iops),
            lat_ratio: ratio($by[$ours].lat_avg_us; $by[$kernel].lat_avg_us),
            iops_ratio_per_round: [range(1; $reps + 1) as $r
              | ratio(($g | map(select(.target == $ours and .round == $r)) | .[0].iops);
                      ($g | map(select(.target == $kernel and .round == $r)) | .[0].iops))]}],
       runs: $runs}' "$RUNS"
}
table() {   # the markdown table from bench.json
  jq -r --arg ours $OURS --arg kernel $KERNEL '
    def n(d): if . == null then "-" else (. * d | round) / d | tostring end;
    def cpus: if . == null or length == 0 then "-" else map(round | tostring + "%") | join(" / ") end;
    "| fio job (\(.setup.rounds) rounds of \(.setup.runtime_s) s, median) | \($ours) IOPS | \($kernel) IOPS | IOPS ours/kernel | per-round IOPS ratio | \($ours) avg lat (us) | \($kernel) avg lat (us) | lat ours/kernel | CPU busy cpu0 / cpu1, \($ours) | CPU busy cpu0 / cpu1, \($kernel) |",
    "|---|---:|---:|---:|---|---:|---:|---:|---|---|",
    (.summary[] |
     "| \(.bs) \(.rw) QD \(.qd) | \(.[$ours].iops | n(1)) | \(.[$kernel].iops | n(1)) | \(.iops_ratio | n(100)) | \(.iops_ratio_per_round | map(n(100)) | join(", ")) | \(.[$ours].lat_avg_us | n(1)) | \(.[$kernel].lat_avg_us | n(1)) | \(.lat_ratio | n(100)) | \(.[$ours].cpu_busy_pct | cpus) | \(.[$kernel].cpu_busy_pct | cpus) |")
  ' "$RESULTS/bench.json"
}
have_table() {   # bench.json holds a ratio for every job (both targets measured)
  summarize > "$RESULTS/bench.json" || return
  table > "$RESULTS/bench.md" || return
  jq -e --argjson n ${#JOBS[@]} '[.summary[] | select(.iops_ratio != null and .lat_ratio != null)] | length == $n' \
    "$RESULTS/bench.json"
}
check "bench.json and bench.md written, with a ratio ours/kernel for each of the ${#JOBS[@]} fio jobs" have_table
echo
echo "## nvmf-tgt vs nvmet-rdma, Linux host + fio, Soft-RoCE in a $(nproc)-CPU TCG guest"
echo "fio on CPU $FIO_CPU; nvmf-tgt on CPU $TGT_CPU (reactor busy-polls while I/O flows); nvmet-rdma: kernel work on any CPU"
echo
cat "$RESULTS/bench.md" 2>/dev/null
echo
# Where nvmf-tgt's CPU went: its reactor's own accounting (busy loop passes that found work).
jq -r --arg ours $OURS '.summary[] | .[$ours] as $o | select($o.rounds > 0) |
  "\(.job): nvmf-tgt process \($o.nvmf_tgt_cpu_pct // "-")% of a CPU, reactor busy with work \($o.reactor_busy_pct // "-")% of the time, \($o.reactor_sleeps_per_1k_io // "-" | if type == "number" then (. * 10 | round) / 10 else . end) sleeps per 1000 I/O (medians)"' \
  "$RESULTS/bench.json" 2>/dev/null
echo
# The issue's goals: figures, not checks (a TCG guest on a shared host is no place to assert speed).
jq -r 'def verdict(r; better): if r == null then "not measured" elif better then "met" else "NOT met" end;
  .summary[] | if .job == "randread-4k-qd32" then
    "goal: 4 KiB randread QD 32 IOPS at least the kernel target'"'"'s: \(verdict(.iops_ratio; .iops_ratio >= 1))"
  elif .job == "randread-4k-qd1" then
    "goal: 4 KiB randread QD 1 average latency no worse than the kernel target'"'"'s: \(verdict(.lat_ratio; .lat_ratio <= 1))"
  else empty end' "$RESULTS/bench.json" 2>/dev/null
finish
