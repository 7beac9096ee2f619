#!/bin/bash
# Guest script behind scripts/interop.sh: one boot runs every requested suite. Sets up the test
# network (dummy0 10.10.0.1, no NIC) and rxe0 once, then runs each suite-NAME.sh in its own
# process under a time limit, and records its closing line and wall time in /results/summary.
# Kernel command line (from run-guest.sh's extra args): lab.suites=a,b,c lab.env=FILE, where
# FILE sets the host-built binaries' paths (see scripts/interop.sh).
. "$(dirname "$0")/guest-lib.sh"
LAB=$(cd "$(dirname "$0")" && pwd)
SUITES= ENVFILE=
for a in $(cat /proc/cmdline); do
  case "$a" in lab.suites=*) SUITES=${a#lab.suites=};; lab.env=*) ENVFILE=${a#lab.env=};; esac
done
[ -r "$ENVFILE" ] || { echo "guest-suites: no binaries file (lab.env=$ENVFILE)"; exit 2; }
set -a; . "$ENVFILE"; set +a
export RESULTS=/results
# Time limits (s) per suite: generous for a loaded 2-core host under TCG; overridable from lab.env.
declare -A LIMIT=([verbs]=${LIMIT_verbs:-1500} [kernel-peers]=${LIMIT_kernel_peers:-600}
  [kernel-host]=${LIMIT_kernel_host:-900} [kernel-target]=${LIMIT_kernel_target:-600} [faults]=${LIMIT_faults:-900}
  [bench]=${LIMIT_bench:-1800})

step "network: $NETDEV $IP mtu $MTU (inside the guest only), Soft-RoCE rxe0"
setup_net > /results/setup.log 2>&1 && setup_rxe >> /results/setup.log 2>&1; rc=$?
cat /results/setup.log
[ $rc -eq 0 ] || echo "guest-suites: rxe0 set-up failed: every suite that needs it will fail"
export GIDX IP NETDEV
rm -f /results/summary
worst=0
for s in ${SUITES//,/ }; do
  step "suite $s (limit ${LIMIT[$s]}s)"
  t0=$(cut -d' ' -f1 /proc/uptime)
  timeout -k 10 "${LIMIT[$s]}" bash "$LAB/suite-$s.sh" < /dev/null 2>&1 | tee "/results/suite-$s.log"
  rc=${PIPESTATUS[0]}
  wall=$(echo "$(cut -d' ' -f1 /proc/uptime) - $t0" | bc)
  closing=$(grep -E "^$s: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$" "/results/suite-$s.log" | tail -1)
  case $rc in
    0) ;;
    124|137) closing="$s: TIMED OUT after ${LIMIT[$s]}s (${closing:-no closing line})";;
    *) [ -n "$closing" ] || closing="$s: exited $rc without a closing line";;
  esac
  [ $rc -eq 0 ] || worst=1
  printf '%s\t%s\t%.1f\t%s\n' "$s" "$rc" "$wall" "$closing" >> /results/summary
  # A suite that died half-way must not leave state for the next one (its own checks report it).
  nvme disconnect-all > /dev/null 2>&1
done
dmesg > /results/dmesg.log
exit $worst
