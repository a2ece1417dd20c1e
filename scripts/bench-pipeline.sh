#!/usr/bin/env bash
# Pipeline parallelism on this CPU (docs/benchmarks.md, "Pipeline parallelism"): the pipeline
# tests' GPT (build/bin/lf_pipeline_checks --bench) in 2 stages on 2 ranks (this machine has 2
# cores: one rank per core), GPipe and 1F1B at 4 and 8 micro-batches and interleaved 1F1B (2
# stages per rank) at 4 and 8, against ddp on the same 2 ranks and global batch (pipe size 1, one
# micro-batch). Each configuration runs REPEATS times (default 5) in turn; each run prints one
# line per rank (see lf_pipeline_checks --bench): step time, idle fractions, the boundary
# transfers' time per step, forward and backward time, micro-batches held, memory growth.
# Then a summary per configuration over the runs: the bubble (the busiest rank's idle fraction)
# as median and range, its ratio to the floor (the schedule's formula: (p - 1) / (m + p - 1),
# interleaved (p - 1) / (v m + p - 1)), the ranks' mean idle, the step and the transfer time.
# BEFORE=DIR also runs DIR/lf_pipeline_checks (an earlier build) in the same rounds, labelled
# "before": like for like on one machine. MODEL="--d-model D --seq L --blocks K --batch B" picks
# the model; STEPS the steps per run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
repeats="${REPEATS:-5}"
steps="${STEPS:-8}"
before="${BEFORE:-}"
read -r -a model <<<"${MODEL:---d-model 128 --seq 256 --blocks 6 --batch 64}"
export OMP_NUM_THREADS=1
lines="$(mktemp)"
trap 'rm -f "$lines"' EXIT
run() {  # label, checks binary, then lf_pipeline_checks flags
  local label="$1" checks="$2"; shift 2
  "$bin/lightning-run" model --accelerator cpu --devices 2 --no-tag-output \
    "$checks" --bench "${model[@]}" --steps "$steps" "$@" | grep '^pipeline bench' | sed "s/^/$label: /" | tee -a "$lines"
}
configs=("GPipe 4 1" "1F1B 4 1" "GPipe 8 1" "1F1B 8 1" "Interleaved1F1B 4 2" "Interleaved1F1B 8 2")
for _ in $(seq "$repeats"); do
  for config in "${configs[@]}"; do
    read -r schedule m v <<<"$config"
    flags=(--pipe 2 --schedule "$schedule" --micro-batches "$m" --stages-per-rank "$v")
    run "$schedule m=$m" "$bin/lf_pipeline_checks" "${flags[@]}"
    [[ -z $before ]] || run "before $schedule m=$m" "$before/lf_pipeline_checks" "${flags[@]}"
  done
  run "ddp" "$bin/lf_pipeline_checks" --pipe 1 --micro-batches 1
done
"${LF_PYTHON:-python3}" - "$lines" <<'EOF'
import collections, re, statistics, sys
runs = collections.defaultdict(lambda: collections.defaultdict(dict))  # label -> run -> rank -> fields
count = collections.Counter()
for line in open(sys.argv[1]):
    label, rest = line.split(": pipeline bench ", 1)
    fields = dict(zip(rest.split()[0::2], rest.split()[1::2]))
    key = (label, int(fields["rank"]))
    runs[label][count[key]][int(fields["rank"])] = fields
    count[key] += 1
print("\nconfiguration | bubble (busiest rank): median [range] | floor | median / floor | mean idle | step ms | transfer ms/step")
for label, by_run in runs.items():
    if label == "ddp":
        continue
    m = int(re.search(r"m=(\d+)", label).group(1))
    v = 2 if "Interleaved" in label else 1
    floor = 1 / (v * m + 1)
    bubbles, idles, steps, transfers = [], [], [], []
    for ranks in by_run.values():
        step = float(ranks[0]["step_ms"])
        busiest = max(float(r["forward_ms"]) + float(r["backward_ms"]) for r in ranks.values())
        bubbles.append(1 - busiest / step)
        idles.append(statistics.mean(float(r["idle"]) for r in ranks.values()))
        steps.append(step)
        if "transfer_ms" in ranks[0]:
            transfers.append(float(ranks[0]["transfer_ms"]))
    b = statistics.median(bubbles)
    print(f"{label} | {b:.4f} [{min(bubbles):.4f}, {max(bubbles):.4f}] | {floor:.4f} | {b / floor:.3f} "
          f"[{min(bubbles) / floor:.3f}, {max(bubbles) / floor:.3f}] | {statistics.median(idles):.4f} | "
          f"{statistics.median(steps):.0f} | " + (f"{statistics.median(transfers):.2f}" if transfers else "-"))
EOF
