#!/usr/bin/env bash
# A one-node Slurm for the engines tests: munged, slurmctld and slurmd with their own key, config,
# sockets, ports and state under DIR, so they touch nothing of the machine's own setup.
#   slurm_cluster.sh start DIR   # installs slurm-wlm and munge if missing; prints the SLURM_CONF to export
#   slurm_cluster.sh stop DIR    # stops the three daemons it started, by the pids in DIR
# Needs root (slurmd starts jobs as their submitting user). CPUs are declared as 8 whatever the
# machine has, so that 4-rank jobs fit on a 2-core machine (SlurmdParameters=config_overrides).
set -euo pipefail
action="${1:?usage: slurm_cluster.sh start|stop DIR}"
dir="${2:?usage: slurm_cluster.sh start|stop DIR}"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

stop_daemons() {
  for name in slurmd slurmctld munged; do
    local pidfile="$dir/$name.pid"
    [ -f "$pidfile" ] || continue
    local pid; pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  done
}

if [ "$action" = stop ]; then
  stop_daemons
  exit 0
fi
[ "$action" = start ] || { echo "slurm_cluster.sh: unknown action '$action' (start or stop)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "slurm_cluster.sh: needs root (slurmd runs jobs as their user)" >&2; exit 2; }
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >"$dir.apt.log" 2>&1
fi

mkdir -p "$dir"/{state,spool,munge}
stop_daemons
chmod 700 "$dir/munge"
head -c 1024 /dev/urandom >"$dir/munge/munge.key"
chmod 600 "$dir/munge/munge.key"
munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"

node="$(hostname -s)"
cat >"$dir/slurm.conf" <<CONF
ClusterName=lfengines
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$node NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=engines Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N "$node"
for _ in $(seq 100); do
  if grep -q idle <<<"$(sinfo -h -o %t 2>/dev/null)"; then echo "SLURM_CONF=$SLURM_CONF"; exit 0; fi
  sleep 0.2
done
echo "slurm_cluster.sh: the node did not become idle within 20 s; logs in $dir" >&2
sinfo >&2 || true
tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop_daemons
exit 1
