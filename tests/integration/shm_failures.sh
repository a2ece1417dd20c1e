#!/usr/bin/env bash
# The shm backend when things go wrong, with real processes:
#   peer_dies        rank 1 is SIGKILLed inside a job while rank 0 waits in an shm collective, then
#                    in the middle of a 64 MB point-to-point send: rank 0 fails within seconds,
#                    naming rank 1 (no launcher: nothing else stops it); /dev/shm holds nothing new
#   launcher_killed  the launcher of a running shm job gets SIGKILL: no worker survives and
#                    /dev/shm holds nothing new (the segment is a memfd and never has a name there)
#   two_jobs         two shm jobs at once on this machine both pass (each has its own segment)
# Usage: shm_failures.sh LIGHTNING_RUN SHM_CHECKS CASE
set -uo pipefail
run="$1"; checks="$2"; case="$3"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; for f in "$dir"/*.out; do echo "--- $f"; cat "$f"; done; exit 1; }
marked() { grep -l -z -x "LF_SHM_MARK=$1" /proc/[0-9]*/environ 2>/dev/null | grep -v "/proc/$$/"; }
free_port() { "${LF_PYTHON:-python3}" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }

case "$case" in
  peer_dies)
    # Twice: rank 1 dies while rank 0 waits in an all_reduce, then in the middle of a 64 MB send
    # to rank 0. Neither leaves anything in /dev/shm.
    ls -A /dev/shm | sort >"$dir/before"
    for mode in --peer-dies --peer-dies-mid-transfer; do
      port=$(free_port)
      for rank in 0 1; do
        RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
          timeout 60 "$checks" $mode >"$dir/rank$rank$mode.out" 2>&1 &
        pids[$rank]=$!
      done
      wait "${pids[0]}"; code0=$?
      wait "${pids[1]}"; code1=$?
      [[ $code0 == 0 ]] || fail "$mode: rank 0 ended with $code0"
      [[ $code1 == 137 ]] || fail "$mode: rank 1 ended with $code1, expected 137 (SIGKILL)"
      grep -q "PASS: the dead peer was named" "$dir/rank0$mode.out" || fail "$mode: rank 0 did not name the dead peer in time"
      grep "rank 0 failed after" "$dir/rank0$mode.out"
    done
    ls -A /dev/shm | sort >"$dir/after"
    new=$(comm -13 "$dir/before" "$dir/after")
    [[ -z $new ]] || fail "new entries in /dev/shm: $new"
    ;;
  launcher_killed)
    ls -A /dev/shm | sort >"$dir/before"
    marker="shm-failures-$$"
    LF_SHM_MARK=$marker "$run" model --accelerator cpu --devices 2 "$checks" --large >"$dir/job.out" 2>&1 &
    launcher=$!
    # Kill it while the ranks move 256 MB through the segment.
    for _ in $(seq 200); do grep -q "rendezvous at" "$dir/job.out" && break; sleep 0.05; done
    grep -q "rendezvous at" "$dir/job.out" || fail "the job never reached its rendezvous"
    sleep 1.5
    kill -9 "$launcher"
    wait "$launcher" 2>/dev/null
    status=$?
    [[ $status == 137 ]] || fail "the launcher ended with $status before the kill (expected 137)"
    for _ in $(seq 60); do
      [[ -z $(marked "$marker") ]] && break
      sleep 0.1
    done
    [[ -z $(marked "$marker") ]] || fail "processes outlived the launcher: $(marked "$marker")"
    ls -A /dev/shm | sort >"$dir/after"
    new=$(comm -13 "$dir/before" "$dir/after")
    [[ -z $new ]] || fail "new entries in /dev/shm: $new"
    ;;
  two_jobs)
    "$run" model --accelerator cpu --devices 2 "$checks" >"$dir/a.out" 2>&1 &
    a=$!
    "$run" model --accelerator cpu --devices 2 "$checks" >"$dir/b.out" 2>&1 &
    b=$!
    wait $a || fail "job a failed"
    wait $b || fail "job b failed"
    [[ $(grep -c "PASS: shm matches gloo" "$dir/a.out") == 2 && $(grep -c "PASS: shm matches gloo" "$dir/b.out") == 2 ]] ||
      fail "a job did not pass on both ranks"
    ;;
  *) fail "unknown case $case" ;;
esac
echo "shm failure case $case passed"
