# Checks for the lab suites (sourced inside the guest by suite-*.sh, after guest-lib.sh).
# Every check prints one line (`ok`, `FAIL` or `skip`, the suite, what was checked); `finish`
# prints the closing `<suite>: N passed, N failed, N skipped` line and returns non-zero on any
# failure. A failing check shows the tail of its command's output, indented.
SUITE=${SUITE:?set SUITE before sourcing suite-lib.sh}
PASSED=0 FAILED=0 SKIPPED=0
LOGS=${RESULTS:-/results}/$SUITE   # the host sees this as build/lab/results/<suite>
mkdir -p "$LOGS"

pass() { PASSED=$((PASSED + 1)); printf 'ok    %s: %s\n' "$SUITE" "$*"; }
fail() { FAILED=$((FAILED + 1)); printf 'FAIL  %s: %s\n' "$SUITE" "$*"; }
skip() { SKIPPED=$((SKIPPED + 1)); printf 'skip  %s: %s\n' "$SUITE" "$*"; }
show() { tail -n "${2:-25}" "$1" | sed 's/^/        | /'; }   # show FILE [LINES]: a failure's evidence

# check "what" CMD...: one check that passes when CMD exits 0. Output goes to $LOGS/<n>.log.
# While SKIP_REASON is set (a binary the checks need does not exist yet), checks are counted as
# skipped without running (and return 0, so the checks that follow one are listed as skipped too).
check() {
  local what=$1 log rc; shift
  if [ -n "${SKIP_REASON:-}" ]; then skip "$what ($SKIP_REASON)"; return 0; fi
  log=$LOGS/check-$((PASSED + FAILED + SKIPPED + 1)).log
  "$@" > "$log" 2>&1; rc=$?
  if [ $rc -eq 0 ]; then pass "$what"; else fail "$what (exit $rc)"; show "$log"; fi
  return $rc
}

# wait_for SECS CMD...: poll CMD every 0.2 s until it succeeds (0), SECS pass (1), or it says it
# never will (exit 2). For waiting on a state change the kernel or a daemon makes asynchronously
# (a listener up, a QP destroyed), never to retry a check that failed.
wait_for() {
  local deadline=$(( $(date +%s) + $1 )) rc; shift
  while :; do
    "$@"; rc=$?
    [ $rc -eq 0 ] && return 0
    [ $rc -eq 2 ] && return 2
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.2
  done
}

# alive PID: the process runs (a child that exited stays a zombie until waited for: not alive).
alive() { [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* (.*) Z ' "/proc/$1/stat"; }
gone() { ! alive "$1"; }

finish() {
  printf '%s: %d passed, %d failed, %d skipped\n' "$SUITE" "$PASSED" "$FAILED" "$SKIPPED"
  [ "$FAILED" -eq 0 ]
}

# ---- RDMA resources as the kernel tracks them (rdma res), to prove nothing leaked ----
rc_qps() { rdma res show qp | grep -c ' type RC ' || true; }             # every RC QP on rxe0
qps_of() { rdma res show qp | grep ' type RC ' | grep -cE "comm $1( |\$)" || true; }  # of one command
no_rc_qps() { [ "$(rc_qps)" -eq 0 ]; }
listening() { rdma res show cm_id | grep -q "state LISTEN .*src-addr $1 "; }  # listening ADDR:PORT
