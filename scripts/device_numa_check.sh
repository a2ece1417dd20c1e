#!/usr/bin/env bash
# The device check's NUMA row: `lightning-run --numa-binding node` on the GPU machine starts a worker
# (grep reading its own Cpus_allowed_list) whose CPUs must be those of its GPU's NUMA node (sysfs:
# the GPU's PCI device's numa_node, that node's cpulist), within the CPUs lightning-run may use.
#   scripts/device_numa_check.sh BIN_DIR
set -uo pipefail
bin=$1
log=$("$bin/lightning-run" model --accelerator cuda --devices 1 --numa-binding node /bin/grep Cpus_allowed_list /proc/self/status 2>&1)
status=$?
echo "$log"
[ "$status" -eq 0 ] || exit "$status"   # without a GPU: lightning-run's own refusal (no CUDA GPU)
expand() {  # "0-3,8" -> one CPU per line
  tr ',' '\n' <<<"$1" | while IFS=- read -r first last; do [ -n "$first" ] && seq "$first" "${last:-$first}"; done
}
got=$(grep -o 'Cpus_allowed_list:[[:space:]]*[0-9,-]*' <<<"$log" | head -n 1 | awk '{print $2}')
# The machine has one GPU (the device check's): nvidia-smi's GPU 0 is CUDA's device 0.
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0 | head -n 1 | tr 'A-F' 'a-f')
bus=${bus: -12}   # 00000000:18:00.0 -> 0000:18:00.0 (sysfs's domain has four digits)
node=$(cat "/sys/bus/pci/devices/$bus/numa_node" 2>/dev/null || echo -1)
allowed=$(awk '/Cpus_allowed_list/ {print $2}' /proc/self/status)
[ "$node" -lt 0 ] && node=0   # no NUMA affinity reported: lightning-run binds to node 0, as torch does
near=$(cat "/sys/devices/system/node/node$node/cpulist")
want=$(comm -12 <(expand "$near" | sort) <(expand "$allowed" | sort) | sort -n | paste -sd' ')
have=$(expand "$got" | sort -n | paste -sd' ')
echo "GPU $bus on NUMA node $node; its CPUs (of those allowed): $want; the worker's: $have"
[ -n "$have" ] && [ "$have" = "$want" ]
