# The hosts harness: several hosts on this one kernel, for tests that cross a real network.
# Source it from a test script (bash), then:
#   hosts_up N            hosts 0..N-1. Host K is a network namespace $(host_ns K) with its own
#                         interface eth0 at $(host_addr K) on a private bridge, the host name
#                         host<K> (a UTS namespace per command), its own /etc/hosts naming every
#                         host, and no route to anything else. Needs root; exits 77 (skip) where
#                         namespaces are not permitted.
#   host_run K CMD...     runs CMD on host K (foreground; put & after it for background)
#   host_pids K           the pids of every process still running on host K
#   host_kill_all K       SIGKILL to every process on host K (a machine that dies)
#   host_link_down K      host K's cable pulled: its port on the bridge goes down
#   host_isolate K        same as host_link_down: K reaches no host and no host reaches K
#   host_add_addr K ADDR  gives host K a second interface, eth1, with the address ADDR/24, as a
#                         host with several interfaces has (a veth whose other end is off the
#                         bridge: nothing reaches it, and eth0's traffic is untouched)
#   host_impair K DELAY_MS LOSS_PERCENT   what host K sends is delayed and partly lost, as
#                         `tc netem delay D loss P%` on its eth0 does (link_emulator.py; this
#                         kernel has no netem)
#   hosts_down            removes everything hosts_up made, by name (hosts_test_setup's EXIT trap
#                         calls it; hosts_up also sweeps what a killed earlier run left behind)
# For test scripts: hosts_test_setup (a scratch folder $HOSTS_TEST_DIR, an EXIT trap removing it
# and every host, OMP_NUM_THREADS=1), fail MESSAGE (prints "FAIL: ..." and counts it in
# $HOSTS_FAILURES), hosts_expect_nothing_left (no process of the job left on any host).
# Names: namespaces lfh<pid>-<K> and lfh<pid>-sw (the bridge), /etc/netns/lfh<pid>-<K>/hosts.
HOSTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HOSTS_PREFIX="lfh$$-"
HOSTS_COUNT=0
HOSTS_EMULATORS=()

host_ns() { echo "${HOSTS_PREFIX}$1"; }
host_addr() { echo "10.77.0.$((10 + $1))"; }
host_name() { echo "host$1"; }
hosts_switch() { echo "${HOSTS_PREFIX}sw"; }

source "$(dirname "${BASH_SOURCE[0]}")/../missing.sh"
hosts_skip() { missing "$@"; }

# Removes the namespaces of earlier runs whose test script no longer exists (killed with -9).
hosts_sweep_stale() {
  local ns owner
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^lfh[0-9]*-' || true); do
    owner=${ns#lfh}; owner=${owner%%-*}
    if ! kill -0 "$owner" 2>/dev/null; then
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
      ip netns del "$ns" 2>/dev/null
      rm -rf "/etc/netns/$ns"
    fi
  done
}

hosts_up() {
  local count=$1 k ns sw
  [ "$(id -u)" = 0 ] || hosts_skip "the hosts harness needs root (network namespaces)"
  command -v ip >/dev/null || hosts_skip "ip (iproute2) is not installed"
  command -v unshare >/dev/null || hosts_skip "unshare (util-linux) is not installed"
  hosts_sweep_stale
  sw=$(hosts_switch)
  ip netns add "$sw" 2>/dev/null || hosts_skip "ip netns add failed: network namespaces are not permitted here"
  ip netns exec "$sw" true 2>/dev/null || { ip netns del "$sw"; hosts_skip "cannot enter network namespaces here"; }
  HOSTS_COUNT=$count
  ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up || hosts_skip "cannot create a bridge here"
  for ((k = 0; k < count; ++k)); do
    ns=$(host_ns "$k")
    ip netns add "$ns" &&
      ip link add eth0 netns "$ns" type veth peer name "h$k" netns "$sw" &&
      ip -n "$sw" link set "h$k" master br0 &&
      ip -n "$sw" link set "h$k" up &&
      ip -n "$ns" addr add "$(host_addr "$k")/24" dev eth0 &&
      ip -n "$ns" link set eth0 up &&
      ip -n "$ns" link set lo up || { echo "FAIL: could not build host $k"; exit 1; }
    mkdir -p "/etc/netns/$ns"
    {
      echo "127.0.0.1 localhost"
      # The IPv4-mapped IPv6 form too: c10d looks up the name of every store connection by it.
      for ((j = 0; j < count; ++j)); do echo "$(host_addr "$j") $(host_name "$j")"; echo "::ffff:$(host_addr "$j") $(host_name "$j")"; done
    } >"/etc/netns/$ns/hosts"
  done
}

host_run() {
  local k=$1; shift
  ip netns exec "$(host_ns "$k")" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$(host_name "$k")" "$@"
}

host_pids() { ip netns pids "$(host_ns "$1")" 2>/dev/null; }

host_kill_all() {
  local pids
  pids=$(host_pids "$1")
  [ -z "$pids" ] || kill -9 $pids 2>/dev/null
  return 0
}

host_link_down() { ip -n "$(hosts_switch)" link set "h$1" down; }

host_add_addr() {
  local ns sw
  ns=$(host_ns "$1")
  sw=$(hosts_switch)
  ip link add eth1 netns "$ns" type veth peer name "h$1b" netns "$sw" &&
    ip -n "$sw" link set "h$1b" up &&
    ip -n "$ns" addr add "$2/24" dev eth1 &&
    ip -n "$ns" link set eth1 up || { echo "FAIL: could not give host $1 the address $2"; exit 1; }
}
host_isolate() { host_link_down "$1"; }

host_impair() {
  local k=$1 delay=$2 loss=$3 sw
  sw=$(hosts_switch)
  command -v ethtool >/dev/null || hosts_skip "ethtool is not installed (the link emulator needs offloads off)"
  # Whole, checksummed frames from every host (a frame the emulator copies loses the kernel's
  # "checksum still to do" mark), so that it can pass them on as they are.
  for ((j = 0; j < HOSTS_COUNT; ++j)); do
    ip netns exec "$(host_ns "$j")" ethtool -K eth0 tx off tso off gso off gro off >/dev/null 2>&1
    ip netns exec "$sw" ethtool -K "h$j" tx off tso off gso off gro off >/dev/null 2>&1
  done
  ip -n "$sw" link set "h$k" nomaster
  ip -n "$sw" link add "e$k" type veth peer name "p$k"
  ip netns exec "$sw" ethtool -K "e$k" tx off tso off gso off gro off >/dev/null 2>&1
  ip -n "$sw" link set "p$k" master br0
  for dev in "h$k" "e$k" "p$k"; do ip -n "$sw" link set "$dev" up promisc on; done
  ip netns exec "$sw" python3 "${LINK_EMULATOR:-$HOSTS_DIR/link_emulator.py}" "h$k" "e$k" --delay-ms "$delay" --loss "$loss" &
  HOSTS_EMULATORS+=($!)
  sleep 0.5
}

hosts_down() {
  local k ns
  for pid in "${HOSTS_EMULATORS[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  for ((k = 0; k < HOSTS_COUNT; ++k)); do
    ns=$(host_ns "$k")
    host_kill_all "$k"
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
  done
  ip netns pids "$(hosts_switch)" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$(hosts_switch)" 2>/dev/null
  HOSTS_COUNT=0
  return 0
}

hosts_test_setup() {
  HOSTS_TEST_DIR=$(mktemp -d)
  HOSTS_FAILURES=0
  trap 'hosts_down; rm -rf "$HOSTS_TEST_DIR"' EXIT
  export OMP_NUM_THREADS=1
}

fail() { echo "FAIL: $*"; HOSTS_FAILURES=$((HOSTS_FAILURES + 1)); }

# Nothing of the job may outlive it, on any host.
hosts_expect_nothing_left() {
  local k
  for ((k = 0; k < HOSTS_COUNT; ++k)); do
    [ -z "$(host_pids "$k")" ] || fail "processes left on host$k: $(host_pids "$k" | tr '\n' ' ')"
  done
}

# Seconds since the epoch, with nanoseconds (for the fault timings).
hosts_now() { date +%s.%N; }
