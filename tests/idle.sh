#!/bin/sh
# Usage: tests/idle.sh COMMAND [ARG...]
#
# Run COMMAND where it takes only the CPU nothing else wants, and exit with its status. `make test`
# runs the unit tests so beside the `alone` lab tests, which leave this machine's two cores idle
# about 45% of the time and must not share them with a second load (they measure CPU shares and
# links); see docs/explanation/measurements.md.
#
# Docker's containers run in cgroups of their own, and a nice value ranks a process only against its
# own cgroup's: `nice` alone would leave COMMAND competing with the nodes as an equal. So, where the
# kernel's cpu controller is writable (root), COMMAND runs in a cgroup made for it beside the
# others, with cpu.idle=1 (the cgroup's tasks run at SCHED_IDLE against every other cgroup; Linux
# 5.15 and newer), or the lowest weight where there is no cpu.idle (cpu.shares=2 on cgroup v1,
# cpu.weight=1 on v2). The cgroup is removed when COMMAND ends. Anywhere else: nice -n 19.
set -u
[ "$#" -gt 0 ] || { echo "usage: tests/idle.sh COMMAND [ARG...]" >&2; exit 2; }

group=""
for root in /sys/fs/cgroup/cpu /sys/fs/cgroup/cpu,cpuacct /sys/fs/cgroup; do
  [ -w "$root" ] && [ -e "$root/cgroup.procs" ] || continue
  if [ "$root" = /sys/fs/cgroup ]; then  # cgroup v2: only where the cpu controller reaches children
    grep -qw cpu "$root/cgroup.subtree_control" 2>/dev/null || continue
  fi
  candidate="$root/ddplab-idle-$$"
  mkdir "$candidate" 2>/dev/null || continue
  if echo 1 > "$candidate/cpu.idle" 2>/dev/null || echo 2 > "$candidate/cpu.shares" 2>/dev/null \
      || echo 1 > "$candidate/cpu.weight" 2>/dev/null; then
    group=$candidate
    break
  fi
  rmdir "$candidate"
done

if [ -z "$group" ]; then
  echo "[idle] no writable cpu cgroup here: running at nice 19, which does not rank it below the nodes" >&2
  exec nice -n 19 "$@"
fi
sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec nice -n 19 "$@"' idle "$group" "$@" &
child=$!
trap 'kill "$child" 2>/dev/null; wait "$child"; rmdir "$group" 2>/dev/null; exit 130' INT TERM
wait "$child"
status=$?
rmdir "$group" 2>/dev/null
exit "$status"
