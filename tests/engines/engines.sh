#!/usr/bin/env bash
# One engines case: the same training program under a real cluster launcher, devices left at
# "auto". Checks that every rank ends with bitwise-equal weights, that they equal a 1-process run
# at the same global batch within 1e-6, the exit code, and that no process of the job is left.
#   engines.sh CASE TRAINER LIGHTNING_RUN SOURCE_DIR
# Slurm cases need SLURM_CONF (the engines.slurm_start fixture sets it). mpirun runs as root here,
# so the Open MPI root permission variables are set. torchrun comes from beside $LF_PYTHON.
set -uo pipefail
case_name="$1" trainer="$2" lightning_run="$3" source_dir="$4"
work="$(mktemp -d "${TMPDIR:-/tmp}/lf-engines-$case_name.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
torchrun="$(dirname "${LF_PYTHON:-python3}")/torchrun"

fail() { echo "FAIL: $case_name: $*"; exit 1; }

# A 1-process run of the same global batch: the reference weights.
"$trainer" --out "$work" >/dev/null 2>&1 && mv "$work/weights-rank0.txt" "$work/reference.txt" ||
  fail "the 1-process reference run failed"

# expect_trained N DIR LOG: N ranks wrote bitwise-equal weights equal to the reference; the log
# shows a ddp group of N.
expect_trained() {
  local ranks="$1" dir="$2" log="$3"
  for ((rank = 0; rank < ranks; rank++)); do
    [ -f "$dir/weights-rank$rank.txt" ] || fail "rank $rank wrote no weights (log: $(tail -n 5 "$log"))"
    cmp -s "$dir/weights-rank0.txt" "$dir/weights-rank$rank.txt" || fail "rank $rank's weights differ from rank 0's"
  done
  [ ! -f "$dir/weights-rank$ranks.txt" ] || fail "more than $ranks ranks wrote weights"
  "$trainer" --compare "$work/reference.txt" "$dir/weights-rank0.txt" --tolerance 1e-6 ||
    fail "the weights differ from the 1-process run: gradients were not averaged"
  [ "$(grep -c "world=$ranks .*strategy=ddp" "$log")" = "$ranks" ] || fail "expected $ranks ddp ranks: $(cat "$log")"
  echo "ok: $ranks ranks, bitwise equal, equal to the 1-process run within 1e-6"
}

# expect_exit CODE_TEST STATUS: e.g. expect_exit -eq 0 "$status".
expect_exit() {
  echo "exit status $3 (expected $1 $2)"
  [ "$2" "$1" "$3" ] || fail "exit status $3, expected $1 $2"
}

# Nothing of the job may outlive it: no process whose command line names this case's folder, and
# no Slurm job of this case still queued.
expect_nothing_left() {
  for _ in $(seq 50); do
    pgrep -f -- "$work" >/dev/null || break
    sleep 0.2
  done
  if pgrep -f -- "$work" >/dev/null; then
    pgrep -a -f -- "$work"
    pkill -KILL -f -- "$work"
    fail "processes of the job were left behind"
  fi
  if [ -n "${SLURM_CONF:-}" ]; then
    # A cancelled step's job stays "completing" (CG) while slurmd finishes its cleanup: allow 20 s.
    for _ in $(seq 100); do
      [ -n "$(squeue -h -n "lf-$case_name" 2>/dev/null)" ] || break
      sleep 0.2
    done
    [ -z "$(squeue -h -n "lf-$case_name" 2>/dev/null)" ] || fail "a Slurm job of this case is still queued: $(squeue -n "lf-$case_name")"
  fi
  echo "ok: nothing left behind"
}

run() {  # run LOG COMMAND...: runs with a 240 s guard, returns its status
  local log="$1"; shift
  timeout -k 5 240 "$@" >"$log" 2>&1
  local status=$?
  cat "$log"
  return $status
}

out="$work/out"
mkdir -p "$out"
log="$work/log"
srun_flags=(-J "lf-$case_name" --quiet)
case "$case_name" in
  srun_2_ranks|srun_4_ranks)
    ranks="${case_name//[!0-9]/}"
    run "$log" srun "${srun_flags[@]}" -n "$ranks" "$trainer" --out "$out"
    expect_exit -eq 0 $?
    expect_trained "$ranks" "$out" "$log"
    ;;
  sbatch_2_ranks)
    printf '#!/bin/bash\nsrun "%s" --out "%s"\n' "$trainer" "$out" >"$work/job.sh"
    run "$log.sbatch" sbatch -J "lf-$case_name" --wait -n 2 -o "$log" "$work/job.sh"
    expect_exit -eq 0 $?
    expect_trained 2 "$out" "$log"
    ;;
  srun_two_concurrent_steps)
    # Two 2-task steps of one allocation at the same time (each long enough to overlap the other):
    # each step has a rendezvous port of its own (the step id is part of the rule), so both train.
    mkdir -p "$out/a" "$out/b"
    {
      echo '#!/bin/bash'
      echo "srun -n 2 --exact \"$trainer\" --steps 300 --out \"$out/a\" >\"$log.a\" 2>&1 & a=\$!"
      echo "srun -n 2 --exact \"$trainer\" --steps 300 --out \"$out/b\" >\"$log.b\" 2>&1 & b=\$!"
      echo 'wait $a; first=$?; wait $b; second=$?; echo "steps exited $first $second"; exit $((first || second))'
    } >"$work/job.sh"
    run "$log.sbatch" sbatch -J "lf-$case_name" --wait -n 4 -o "$log" "$work/job.sh"
    status=$?
    cat "$log" "$log.a" "$log.b"
    expect_exit -eq 0 "$status"
    for step in a b; do
      for rank in 0 1; do
        [ -f "$out/$step/weights-rank$rank.txt" ] || fail "step $step, rank $rank wrote no weights"
      done
      cmp -s "$out/$step/weights-rank0.txt" "$out/$step/weights-rank1.txt" || fail "step $step: the ranks differ"
    done
    cmp -s "$out/a/weights-rank0.txt" "$out/b/weights-rank0.txt" || fail "the two steps trained differently"
    echo "ok: two concurrent steps of one allocation trained, each with bitwise-equal ranks"
    ;;
  salloc_srun_2_ranks)
    run "$log" salloc -J "lf-$case_name" -n 2 srun --quiet "$trainer" --out "$out"
    expect_exit -eq 0 $?
    expect_trained 2 "$out" "$log"
    ;;
  allocation_shell_without_srun)
    # In an allocation's shell (salloc) and in a batch script, without srun, the program is not a
    # Slurm task: --devices 2 starts its own 2 processes, as on a workstation.
    run "$log" salloc -J "lf-$case_name" -n 2 "$trainer" --devices 2 --out "$out"
    expect_exit -eq 0 $?
    expect_trained 2 "$out" "$log"
    rm -f "$out"/weights-rank*.txt
    printf '#!/bin/bash\n"%s" --devices 2 --out "%s"\n' "$trainer" "$out" >"$work/job.sh"
    run "$log.sbatch" sbatch -J "lf-$case_name" --wait -n 2 -o "$log" "$work/job.sh"
    expect_exit -eq 0 $?
    expect_trained 2 "$out" "$log"
    ;;
  lightning_run_inside_an_allocation)
    # The documented batch script: one lightning-run per node, each starting its devices' workers.
    PATH="$(dirname "$lightning_run"):$PATH" run "$log.sbatch" sbatch -J "lf-$case_name" --wait -N 1 -o "$log" \
      "$source_dir/examples/slurm/lightning-run.sbatch" --accelerator cpu --devices 2 -- "$trainer" --out "$out"
    expect_exit -eq 0 $?
    expect_trained 2 "$out" "$log"
    ;;
  srun_failing_rank|srun_failing_rank_kill_on_bad_exit)
    # Rank 1 exits before joining. Without --kill-on-bad-exit, srun waits for rank 0, which must end
    # by itself within the rendezvous timeout, naming rank 1 (and the same the other way round);
    # with it, srun ends the job at once.
    flags=()
    [ "$case_name" = srun_failing_rank_kill_on_bad_exit ] && flags=(--kill-on-bad-exit=1)
    start=$SECONDS
    LT_RENDEZVOUS_TIMEOUT=10 run "$log" srun "${srun_flags[@]}" "${flags[@]}" -n 2 "$trainer" --fail-rank 1 --out "$out"
    status=$?
    # srun returns its tasks' highest exit code, or 128 + a signal: rank 0's uncaught rendezvous
    # error aborts it (134); with --kill-on-bad-exit srun SIGTERMs it as soon as rank 1 fails (143).
    if [ ${#flags[@]} -eq 0 ]; then expect_exit -eq 134 "$status"; else expect_exit -eq 143 "$status"; fi
    [ $((SECONDS - start)) -lt 60 ] || fail "the job took $((SECONDS - start)) s to end"
    [ ! -f "$out/weights-rank0.txt" ] || fail "rank 0 trained alone"
    grep -q "fails on purpose" "$log" || fail "rank 1 did not fail as planted"
    if [ ${#flags[@]} -eq 0 ]; then
      grep -q "Rank 1 of 2 did not join the process group within the rendezvous timeout (10 s)" "$log" ||
        fail "rank 0 did not name the missing rank"
      # Rank 0, which hosts the store, fails: rank 1 names it after the same timeout.
      LT_RENDEZVOUS_TIMEOUT=10 run "$log" srun "${srun_flags[@]}" -n 2 "$trainer" --fail-rank 0 --out "$out"
      expect_exit -eq 134 $?
      grep -q "Rank 1 could not reach the store of rank 0 .* within the rendezvous timeout (10 s)" "$log" ||
        fail "rank 1 did not name rank 0"
    fi
    ;;
  mpirun_2_ranks|mpirun_4_ranks)
    ranks="${case_name//[!0-9]/}"
    run "$log" mpirun --oversubscribe -np "$ranks" "$trainer" --out "$out"
    expect_exit -eq 0 $?
    expect_trained "$ranks" "$out" "$log"
    ;;
  mpirun_failing_rank)
    start=$SECONDS
    LT_RENDEZVOUS_TIMEOUT=10 run "$log" mpirun --oversubscribe -x LT_RENDEZVOUS_TIMEOUT -np 2 "$trainer" --fail-rank 1 --out "$out"
    expect_exit -eq 3 $?  # the planted failure's own code, which mpirun returns
    grep -q "fails on purpose" "$log" || fail "rank 1 did not fail as planted"
    [ $((SECONDS - start)) -lt 60 ] || fail "the job took $((SECONDS - start)) s to end"
    ;;
  torchrun_no_python)
    [ -x "$torchrun" ] || fail "torchrun not found beside LF_PYTHON=${LF_PYTHON:-}"
    run "$log" "$torchrun" --standalone --nproc-per-node 2 --no-python "$trainer" --out "$out"
    expect_exit -eq 0 $?
    expect_trained 2 "$out" "$log"
    ;;
  torchrun_constructor_error_file)
    # devices=3 under a 2-process torchrun: the Fabric constructor throws; the error file must carry
    # the message to torchrun's failure report.
    [ -x "$torchrun" ] || fail "torchrun not found beside LF_PYTHON=${LF_PYTHON:-}"
    run "$log" "$torchrun" --standalone --nproc-per-node 2 --no-python "$trainer" --devices 3 --out "$out"
    expect_exit -eq 1 $?  # torchrun's code for a failed worker
    grep -q "error_file: /" "$log" || fail "torchrun found no error file"
    grep -q "Fabric is configured for devices=3 per node, but the launcher started 2 processes" "$log" ||
      fail "torchrun's report does not carry the constructor's error"
    ;;
  srun_hang|mpirun_hang)
    # Rank 1 spins outside a collective while rank 0 waits in one: the ranks judge through the
    # store; rank 0 reports, dumps and exits with 86, and the launcher ends the job.
    hang_program="$(dirname "$trainer")/lf_hang_program"
    start=$SECONDS
    export LT_HANG_TIMEOUT=3 LT_HANG_DUMP_DIR="$work/dumps"
    if [ "$case_name" = srun_hang ]; then
      run "$log" srun "${srun_flags[@]}" --kill-on-bad-exit=1 -n 2 "$hang_program" infinite_loop
    else
      run "$log" mpirun --oversubscribe -x LT_HANG_TIMEOUT -x LT_HANG_DUMP_DIR -np 2 "$hang_program" infinite_loop
    fi
    status=$?
    unset LT_HANG_TIMEOUT LT_HANG_DUMP_DIR
    # mpirun returns rank 0's 86; srun --kill-on-bad-exit SIGTERMs the step when rank 0 exits (143).
    if [ "$case_name" = srun_hang ]; then expect_exit -eq 143 "$status"; else expect_exit -eq 86 "$status"; fi
    [ $((SECONDS - start)) -lt 30 ] || fail "the job took $((SECONDS - start)) s to end"
    grep -q "likely cause: rank 1 never entered collective #9 all_reduce float32\[4\] on world" "$log" ||
      fail "rank 0 did not report the hang"
    grep -q "ending the job with exit code 86" "$log" || fail "rank 0 did not end the job with 86"
    for file in report.txt rank_0.stack.txt rank_1.stack.txt rank_0.flight.txt rank_1.flight.txt; do
      [ -s "$work/dumps/$file" ] || fail "missing dump $file"
    done
    grep -q spin_forever_on_purpose "$work/dumps/rank_1.stack.txt" || fail "rank 1's stack does not show its loop"
    echo "ok: hang reported after $((SECONDS - start)) s, exit status $status"
    ;;
  srun_straggler|mpirun_straggler|torchrun_straggler)
    # Rank 1 sleeps 120 ms before each step's all_reduce: rank 0's watchdog names it from the
    # entries every rank publishes in the store, once, with its host and lag.
    straggler_job="$(dirname "$trainer")/lf_straggler_job"
    job=("$straggler_job" 60 1 120 "$work")  # the last argument only marks the job's processes
    case "$case_name" in
      srun_straggler) run "$log" srun "${srun_flags[@]}" -n 2 "${job[@]}" ;;
      mpirun_straggler) run "$log" mpirun --oversubscribe -np 2 "${job[@]}" ;;
      torchrun_straggler) run "$log" "$torchrun" --standalone --nproc-per-node 2 --no-python "${job[@]}" ;;
    esac
    expect_exit -eq 0 $?
    source "$source_dir/tests/integration/expect_straggler.sh"
    expect_straggler "$(cat "$log")" "lightning-fabric: rank 1 on $(hostname)"
    ;;
  *)
    fail "unknown case"
    ;;
esac
expect_nothing_left
echo "PASS: $case_name"
