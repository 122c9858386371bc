#!/bin/sh
# The measurements, inside the netem VM. Two "nodes": network namespaces A and B joined by a veth
# pair whose ends are both called eth0, as in a lab's containers. The tc commands come from
# labctl's own builders, rendered on the host into /plan (see netem_vm.py); this script only runs
# them, in the node's namespace, and runs the measuring tools. Its output is a list of blocks,
#   @@netem-begin NAME KIND uptime=SECONDS
#   ...the tool's own output...
#   @@netem-end NAME KIND rc=CODE uptime=SECONDS
# which the host parses. /plan/cases has one case a line: NAME MEASURE ARGS...
#   ping COUNT INTERVAL       ICMP echo A -> B (busybox ping), every reply's time
#   udp SECONDS BITRATE LEN   iperf3 UDP A -> B, JSON (datagrams sent and lost)
#   tcp SECONDS               iperf3 TCP A -> B, JSON (bits per second received)
PLAN=/plan
A_ADDR=10.0.0.1
B_ADDR=10.0.0.2

uptime_s() { cut -d' ' -f1 /proc/uptime; }

# block NAME KIND COMMAND...: run the command and frame its output (stdout and stderr).
block() {
  name=$1; kind=$2; shift 2
  echo "@@netem-begin $name $kind uptime=$(uptime_s)"
  "$@" 2>&1
  rc=$?
  echo "@@netem-end $name $kind rc=$rc uptime=$(uptime_s)"
  return "$rc"
}

in_ns() { ns=$1; shift; ip netns exec "$ns" "$@"; }

setup() {
  ip netns add A && ip netns add B &&
    ip link add eth0 netns A type veth peer name eth0 netns B &&
    in_ns A ip addr add "$A_ADDR/24" dev eth0 && in_ns B ip addr add "$B_ADDR/24" dev eth0 &&
    in_ns A ip link set lo up && in_ns B ip link set lo up &&
    in_ns A ip link set eth0 up && in_ns B ip link set eth0 up
}

load_late_modules() {
  for module in /late-modules/*.ko; do insmod "$module" || return 1; done
}

start_server() { in_ns B iperf3 -s -D -B "$B_ADDR" >/dev/null 2>&1; sleep 0.2; }

# iperf3 -u starts a test with one datagram each way (its UDP connect message and the reply), which
# iperf 3.12 never sends again: the case's own netem loss can drop either, and the client then gives
# up after 30 s of guest time ("unable to read from stream socket") while the server stays busy with
# the test that never began. That is not the datagram loss being measured, so the server is started
# afresh and the run tried again, up to 3 times in all, with a line saying so.
udp_tries() {
  for attempt in 1 2 3; do
    out=$("$@" 2>&1)
    rc=$?
    case "$out" in
      *"unable to read from stream socket"*)
        killall iperf3 2>/dev/null; sleep 0.2; start_server
        if [ "$attempt" -lt 3 ]; then echo "retry: try $attempt lost iperf3's UDP handshake"; continue; fi ;;
    esac
    printf '%s\n' "$out"
    return "$rc"
  done
}

measure() {  # NAME MEASURE ARGS...
  name=$1; what=$2; shift 2
  case "$what" in
    ping) block "$name" ping in_ns A ping -c "$1" -i "$2" "$B_ADDR" ;;
    udp) block "$name" udp udp_tries in_ns A iperf3 -c "$B_ADDR" -u -t "$1" -b "$2" -l "$3" -i 0 -J ;;
    tcp) block "$name" tcp in_ns A iperf3 -c "$B_ADDR" -t "$1" -i 0 -J ;;
    *) echo "@@netem-error $name: unknown measure $what" ;;
  esac
}

block setup setup setup || exit 1
# The probe on a kernel without netem, then with it.
block probe-before probe in_ns A sh "$PLAN/probe.sh"
block load-netem insmod load_late_modules
block probe-after probe in_ns A sh "$PLAN/probe.sh"

start_server

while read -r name what args; do
  [ -n "$name" ] || continue
  block "$name" shape-A in_ns A sh "$PLAN/$name.A.sh" || continue
  block "$name" shape-B in_ns B sh "$PLAN/$name.B.sh" || continue
  block "$name" qdisc-A in_ns A tc qdisc show dev eth0
  block "$name" qdisc-A-ifb in_ns A sh -c 'tc qdisc show dev ifb0 2>/dev/null || true'
  block "$name" class-A in_ns A tc class show dev eth0
  block "$name" filter-A in_ns A tc filter show dev eth0
  # shellcheck disable=SC2086 # the case's arguments, one word each
  measure "$name" "$what" $args
done < "$PLAN/cases"
