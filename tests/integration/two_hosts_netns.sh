#!/usr/bin/env bash
# Two hosts for real: two network namespaces joined by a veth pair (10.213.7.1 and 10.213.7.2),
# one lightning-run per namespace as node 0 and node 1 with unequal worker counts, rendezvous
# through --main-address 10.213.7.1. Skips (exit 77) where network namespaces are not allowed.
#   two_hosts_netns.sh LIGHTNING_RUN TEST_WORKER
set -u
launcher=$1
worker=$2
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"

ns0=lfa$$
ns1=lfb$$
dir=$(mktemp -d)
cleanup() {
  ip netns pids "$ns0" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$ns1" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$ns0" 2>/dev/null
  ip netns del "$ns1" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
ip netns add "$ns0" 2>/dev/null || skip "ip netns add failed: network namespaces are not permitted here"
ip netns add "$ns1" 2>/dev/null || skip "ip netns add failed: network namespaces are not permitted here"
ip netns exec "$ns0" true 2>/dev/null || skip "ip netns exec failed: cannot enter network namespaces here"
ip link add "v0$$" netns "$ns0" type veth peer name "v1$$" netns "$ns1" 2>/dev/null || skip "cannot create a veth pair"
ip -n "$ns0" addr add 10.213.7.1/24 dev "v0$$"
ip -n "$ns1" addr add 10.213.7.2/24 dev "v1$$"
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "v0$$" up
ip -n "$ns1" link set "v1$$" up

common=(model --accelerator cpu --num-nodes 2 --main-address 10.213.7.1 --main-port 29400 --rdzv-timeout 30 --shutdown-grace 2)
ip netns exec "$ns0" env LF_TEST_GLOO_IFACE="v0$$" "$launcher" "${common[@]}" --node-rank 0 --devices 1 "$worker" barrier \
  >"$dir/node0" 2>&1 &
node0=$!
ip netns exec "$ns1" env LF_TEST_GLOO_IFACE="v1$$" "$launcher" "${common[@]}" --node-rank 1 --devices 2 "$worker" barrier \
  >"$dir/node1" 2>&1 &
node1=$!
wait "$node0"; code0=$?
wait "$node1"; code1=$?
echo "--- node 0 (exit $code0)"; cat "$dir/node0"
echo "--- node 1 (exit $code1)"; cat "$dir/node1"
[ "$code0" = 0 ] && [ "$code1" = 0 ] || { echo "FAILED: a launcher exited non-zero"; exit 1; }
grep -q "\[rank 0\]: rank 0 passed barrier" "$dir/node0" || { echo "FAILED: rank 0 did not pass"; exit 1; }
grep -q "\[rank 1\]: rank 1 passed barrier" "$dir/node1" || { echo "FAILED: rank 1 did not pass"; exit 1; }
grep -q "\[rank 2\]: rank 2 passed barrier" "$dir/node1" || { echo "FAILED: rank 2 did not pass"; exit 1; }
grep -q "rendezvous at 10.213.7.1:29400" "$dir/node1" || { echo "FAILED: node 1 did not use --main-address"; exit 1; }
echo "two hosts: 1 passed, 0 failed"
