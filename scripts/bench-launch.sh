#!/usr/bin/env bash
# P4: time from start until every worker has passed a first gloo barrier and the job has exited,
# for 2 and 8 workers: lightning-run, a raw fork/exec of the same worker with the environment set
# by hand (apps/bench_raw_launch.cpp), and torchrun --no-python (PyTorch 2.11 of the project's
# environment, --monitor-interval 0.1). Runs interleaved, REPEATS times each; prints medians and
# ratios. Then the launchers' own peak resident memory: GNU time's maximum resident set also covers
# the workers the launcher waited for, so that run uses /bin/sleep as the worker (2 MiB), which
# leaves the launcher's own peak.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
repeats="${REPEATS:-7}"
python="${LF_PYTHON:-$root/.venv/bin/python}"
torchrun="$(dirname "$python")/torchrun"
# torchrun needs a real port: with 0 its workers are told port 0 and never meet.
free_port() { "$python" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
if [ ! -x /usr/bin/time ]; then
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends time
fi
export OMP_NUM_THREADS=1
worker="$bin/lf_test_worker"

timed() {  # prints seconds and peak KiB of the launcher process
  /usr/bin/time -f "%e %M" -o /tmp/lf-bench-time "$@" >/dev/null 2>&1
  cat /tmp/lf-bench-time
}
for n in 2 8; do
  : > /tmp/lf-bench-$n
  for _ in $(seq "$repeats"); do
    echo "lightning-run $(timed "$bin/lightning-run" model --accelerator cpu --devices "$n" "$worker" barrier)" >> /tmp/lf-bench-$n
    echo "raw $(timed "$bin/bench_raw_launch" "$n" "$worker" barrier)" >> /tmp/lf-bench-$n
    echo "torchrun $(timed "$torchrun" --nproc-per-node "$n" --monitor-interval 0.1 \
      --master-addr 127.0.0.1 --master-port "$(free_port)" --no-python "$worker" barrier)" >> /tmp/lf-bench-$n
  done
  "$python" - "$n" <<'PY'
import statistics, sys
n = sys.argv[1]
rows = [line.split() for line in open(f"/tmp/lf-bench-{n}")]
med = {k: statistics.median(float(r[1]) for r in rows if r[0] == k) for k in ("lightning-run", "raw", "torchrun")}
mem = {k: max(int(r[2]) for r in rows if r[0] == k) for k in ("lightning-run", "raw", "torchrun")}
print(f'{{"benchmark":"P4 launch to first barrier","workers":{n},"repeats":{len(rows)//3},'
      f'"lightning_run_s":{med["lightning-run"]:.3f},"raw_fork_exec_s":{med["raw"]:.3f},"torchrun_s":{med["torchrun"]:.3f},'
      f'"ratio_vs_torchrun":{med["lightning-run"]/med["torchrun"]:.3f},"ratio_vs_raw":{med["lightning-run"]/med["raw"]:.3f},'
      f'"launcher_peak_rss_kib":{mem["lightning-run"]},"raw_peak_rss_kib":{mem["raw"]},"torchrun_agent_peak_rss_kib":{mem["torchrun"]}}}')
PY
done

# The launchers' own peak memory, 2 sleeping workers each (the largest of REPEATS runs).
: > /tmp/lf-bench-mem
for _ in $(seq "$repeats"); do
  echo "lightning-run $(timed "$bin/lightning-run" model --accelerator cpu --devices 2 /bin/sleep 1)" >> /tmp/lf-bench-mem
  echo "torchrun $(timed "$torchrun" --nproc-per-node 2 --monitor-interval 0.1 --master-addr 127.0.0.1 \
    --master-port "$(free_port)" --no-python /bin/sleep 1)" >> /tmp/lf-bench-mem
done
"$python" - <<'PY'
rows = [line.split() for line in open("/tmp/lf-bench-mem")]
mem = {k: max(int(r[2]) for r in rows if r[0] == k) for k in ("lightning-run", "torchrun")}
print(f'{{"benchmark":"launcher peak resident memory, 2 workers","lightning_run_kib":{mem["lightning-run"]},'
      f'"torchrun_agent_kib":{mem["torchrun"]},"ratio":{mem["lightning-run"]/mem["torchrun"]:.3f}}}')
PY
