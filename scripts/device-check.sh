#!/usr/bin/env bash
# The GPU check, run on the borrowed GPU machine (no network; PyTorch with CUDA and Lightning in its
# python3) through the device tool, as one command of at most 8 minutes (its own deadline ends it
# at 470 s; the call's timeout_s=540 is only a backstop):
#   (here, once)  scripts/vendor-headers.sh     # third_party/: header-only deps, git-ignored
#   (device)      run(command="bash scripts/device-check.sh", carry=["third_party"], timeout_s=540)
# It configures the project against that python3's LibTorch, builds the programs of one list
# (device_targets below: every program a row runs is in it), and runs:
#   0. the launcher sees the GPU, and `--numa-binding node` gives its worker the CPUs of the GPU's
#      NUMA node (scripts/device_numa_check.sh);
#   1. the gpu tests: the cuda accelerator, 16-mixed and bf16-mixed, the loss scaler's kernels on
#      CUDA against the same scaler on CPU, training on an NCCL group, a background save's pinned
#      host copy and its bytes against fabric.save's;
#   2. every Fabric collective and a save/load round trip on an NCCL group, under ddp and fsdp
#      (fsdp with a float16 loss scaler whose overflow flag crosses the group);
#   3. the step-time benchmark per precision (Fabric's fused optimizer step against the raw loop);
#   4. P8: the bf16-mixed GPT step of examples/gpt (LibTorch's AdamW step and Fabric's fused one)
#      against scripts/p8_python_fabric.py under Python Lightning Fabric (AdamW's default and
#      fused=True) and in plain PyTorch (fused=True), same GPU, model and batch, alternated in every
#      round (P8_ROUNDS, default 2). Round 1 runs all five with one profiled step each (kernel
#      counts; FLOPs and MFU); later rounds run the goals' three: C++ fused, Python Fabric's default
#      and plain PyTorch fused (goals: C++ fused at most 0.90 of Python Fabric's default, and no
#      slower than plain PyTorch with fused AdamW).
#   5. CUDA graph: in every P8 round, right after the C++ fused run, the same command captured as a
#      CUDA graph (lf::CapturedStep, experimental); that fused run is its eager side (same seed and
#      batches): steps per second and the weights after training.
#   6. fsdp + activation checkpointing on one GPU: the C++ GPT (--fsdp-block-units, with and
#      without --activation-checkpointing) against Python Lightning Fabric's FSDPStrategy with
#      auto_wrap_policy and activation_checkpointing_policy={Block}, bf16-mixed: the step-time
#      cost of checkpointing on each side, and Python's peak CUDA memory with and without it.
#   7. tensor parallel at world size 1 (the machine has one GPU): examples/tensor_parallel_gpt under
#      the model_parallel strategy on an NCCL group of one (mesh 1 x 1), saving a sharded (DCP)
#      checkpoint, then resuming from it; the resumed run must start from the saved step. Then the
#      same at mesh 1 x 1 with fsdp on the data dimension, sequence parallelism and dropout (the 2-D
#      strategy's code path on CUDA: shards over a data group of one), resumed under ddp; and HSDP
#      (mesh replicate 1 x shard 1 x tensor 1, the hybrid path).
#   8. streaming data on the GPU: the rows make their own data (the machine has no Fashion-MNIST
#      and no litdata): synthetic idx files (scripts/synthetic_fashion_mnist.py, python3's standard
#      library), written as a streaming dataset by the image classifier's --write-data
#      (lf::StreamingWriter), then trained from on the GPU with batches read ahead into pinned memory.
# Each row is independent: a failing row is reported and the rest still run, each under its own
# cap and the one deadline (DEVICE_CHECK_BUDGET_S, 470 s); a row the deadline leaves no time for
# is "skipped (budget)". It prints its own estimate first and ends with a table of every row and
# a summary. Logs and results.md go to $OUT (when set), else build-device/out.
#
#   DEVICE_CHECK_ONLY=REGEX              runs only the rows whose names match (an extended regex), to
#     rerun the rows that failed without spending device time on the rest; the build is the same.
#     A CUDA-graph row's eager side is its round's C++ fused row: rerun '^(p8-cpp-fused|graph-)';
#     the streaming rows need their data rows: '^streaming-'.
#   DEVICE_CHECK_TARGETS="T ..."         replaces device_targets (what the device build builds and
#     what the rows are held to); tests/gpu/CMakeLists.txt plants a list without a program with it.
#
#   scripts/device-check.sh --dry-run   on a CPU machine (CI, tests/CMakeLists.txt): builds nothing,
#     checks every row's plumbing against build/bin (LF_BIN_DIR) and LF_PYTHON: each program a row
#     runs from the bin folder is in device_targets (so a program CI's full build has but the device
#     build would not build fails here) and exists, and each GPU row's command, run without a GPU,
#     refuses cleanly (exit 77, 2 or 1 with a message naming the missing CUDA GPU), never crashes
#     or hangs. The rows that make data need no GPU and run for real (they must exit 0). The
#     estimate must leave at least 60 s of the budget. Exit 0 when all holds; otherwise 1, each
#     failed row named with its reason.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dry_run=0
[ "${1:-}" = --dry-run ] && dry_run=1
out="${OUT:-$root/build-device/out}"
build="$root/build-device"
scratch="$build"                      # checkpoints and data the rows write
[ "$dry_run" = 1 ] && scratch="$out/scratch"
mkdir -p "$out" "$scratch"
results="$out/results.md"
: >"$results"
say() { echo "$*" | tee -a "$results"; }
deadline=$((SECONDS + ${DEVICE_CHECK_BUDGET_S:-470}))
left() { local l=$((deadline - SECONDS)); echo $((l > 1 ? l : 1)); }  # never 0: `timeout 0` means no limit
failures=()
rows=()          # "name|result|exit|seconds" per row, for the table
declare -A refused_before  # dry run: each distinct command is run once

# The device build's targets: every program a row runs from the bin folder must be one of them
# (the rows and the dry run check it).
device_targets=(lightning_fabric lightning-run lightning-run-launcher lf_gpu_tests lf_collective_checks bench_step_time gpt
  tensor_parallel_gpt image_classifier)
[ -n "${DEVICE_CHECK_TARGETS+set}" ] && read -r -a device_targets <<<"$DEVICE_CHECK_TARGETS"
in_device_build() { local target; for target in "${device_targets[@]}"; do [ "$target" = "$1" ] && return 0; done; return 1; }

p8_rounds="${P8_ROUNDS:-2}"
[[ $p8_rounds =~ ^[1-9][0-9]{0,1}$ ]] || { echo "P8_ROUNDS=$p8_rounds: give a whole number of rounds from 1 to 99 (default 2)" >&2; exit 2; }
# The script's own estimate in seconds, printed before anything runs. Basis: the 2026-12-04 run on
# an H200 (configure and build 78-100 s; 27 rows in about 250 s, 341 s in all): a row is mostly
# process start, CUDA and NCCL initialisation (and Python's imports), not its steps.
est_build=$((15 + 120))                      # configure 15, build 120
est_gpu=$((3 + 3 + 10 + 10 + 2 * 12))        # launcher probe 3, NUMA binding 3, gpu tests 10, nccl training 10, collectives 2 x 12
est_step=$((3 * 8))                          # step times: 3 precisions x 8
est_p8_first=$((2 * 8 + 3 * 10 + 8))         # round 1: 2 C++ x 8, 3 Python x 10, CUDA graph 8
est_p8_later=$((8 + 2 * 10 + 8))             # each later round: C++ fused 8, 2 Python x 10, CUDA graph 8
est_p8=$((est_p8_first + (p8_rounds - 1) * est_p8_later))
est_ac=$((2 * 10 + 2 * 12))                  # fsdp + checkpointing: 2 C++ x 10, 2 Python x 12
est_tp=$((5 * 8))                            # tensor parallel: 5 x 8
est_stream=$((2 + 3 + 10))                   # streaming: idx files 2, streaming dataset 3, training 10
estimate=$((est_build + est_gpu + est_step + est_p8 + est_ac + est_tp + est_stream))
say "# device-check $(date -u +%Y-%m-%dT%H:%MZ)$([ "$dry_run" = 1 ] && echo ' (dry run)')"
say "- estimate: ${estimate} s in all, budget ${DEVICE_CHECK_BUDGET_S:-470} s (configure + build ${est_build}," \
  "gpu tests and collectives ${est_gpu}, step times ${est_step}, P8 + CUDA graph ${est_p8} (${p8_rounds} rounds)," \
  "fsdp + checkpointing ${est_ac}, tensor parallel ${est_tp}, streaming ${est_stream})"
# The dry run also holds the estimate to the deadline: a row added without time taken elsewhere
# fails here, not on the device.
if [ "$dry_run" = 1 ] && [ "$estimate" -gt $((${DEVICE_CHECK_BUDGET_S:-470} - 60)) ]; then
  failures+=(estimate)
  say "- estimate: ${estimate} s leaves less than 60 s of the ${DEVICE_CHECK_BUDGET_S:-470} s budget; trim rows (repeats, steps) first"
fi

if [ "$dry_run" = 1 ]; then
  bin="${LF_BIN_DIR:-$root/build/bin}"
  python="${LF_PYTHON:-$root/.venv/bin/python}"
  [ -x "$python" ] || python="$(command -v python3)"
else
  say "- machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
  python="$(command -v python3 || true)"
  [ -n "$python" ] || { say "- FAIL: no python3, so no PyTorch LibTorch to build against"; exit 1; }
  prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)"
  say "- torch: $("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1 | tail -n 1)"
  say "- lightning: $("$python" -c 'import lightning; print(lightning.__version__)' 2>&1 | tail -n 1)"
  [ -d "$root/third_party/include" ] || { say "- FAIL: third_party/ missing: run scripts/vendor-headers.sh here and carry it"; exit 1; }

  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  compiler="${CXX:-$(command -v g++ || command -v clang++)}"
  timeout "$(left)" cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DLF_PYTHON="$python" -DLF_THIRD_PARTY_DIR="$root/third_party" -DLF_WITH_CUDA=ON \
    -DCMAKE_CXX_COMPILER="$compiler" >"$out/configure.log" 2>&1
  status=$?
  say "- configure: exit $status (configure.log)"
  [ "$status" -eq 0 ] || { tail -n 30 "$out/configure.log" | tee -a "$results"; exit 1; }

  timeout "$(left)" cmake --build "$build" -j "$(nproc)" --target "${device_targets[@]}" -- -k 0 >"$out/build.log" 2>&1
  status=$?
  say "- build: exit $status in ${SECONDS} s so far (build.log)"
  # A target that failed to build fails its rows only (each row checks its programs).
  [ "$status" -eq 0 ] || grep -m 40 -E "error|Error" "$out/build.log" | tee -a "$results"
  bin="$build/bin"
fi
# The programs a command needs: its first word and every word that names a file under $bin or a
# script of this repository.
programs_of() {
  local word
  for word in "$@"; do
    case "$word" in
      "$bin"/*|"$root"/scripts/*) echo "$word" ;;
    esac
  done
  case "$1" in "$bin"/*|"$root"/*) ;; *) command -v "$1" || echo "$1" ;; esac
  case "$1" in "$bin/lightning-run") echo "$bin/lightning-run-launcher" ;; esac
}
row() {  # row NAME RESULT EXIT SECONDS
  rows+=("$1|$2|$3|$4")
  say "- $1: $2 (exit $3, $4 s)"
}
run_step() { run_row gpu "$@"; }   # run_step NAME COMMAND...: a row that needs the GPU
make_data() { run_row data "$@"; } # make_data NAME COMMAND...: a row that writes a later row's data on the CPU
run_row() {  # run_row gpu|data NAME COMMAND...: runs under the row cap and the deadline, records the result
  local kind="$1" name="$2"; shift 2
  if [ -n "${DEVICE_CHECK_ONLY:-}" ] && ! [[ $name =~ $DEVICE_CHECK_ONLY ]]; then return 0; fi
  local started=$SECONDS program missing=() unbuilt=()
  while read -r program; do
    case "$program" in "$bin"/*) in_device_build "${program#"$bin"/}" || unbuilt+=("${program#"$bin"/}") ;; esac
    [ -e "$program" ] || missing+=("$program")
  done < <(programs_of "$@")
  if [ ${#unbuilt[@]} -gt 0 ]; then
    failures+=("$name")
    row "$name" "${unbuilt[*]} is not in the device build's targets (add it to device_targets in scripts/device-check.sh)" - 0
    return 1
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    failures+=("$name"); row "$name" "missing ${missing[*]}" - 0; return 1
  fi
  if [ "$dry_run" = 1 ] && [ "$kind" = data ]; then
    CUDA_VISIBLE_DEVICES='' timeout 120 "$@" >"$out/$name.log" 2>&1
    local status=$?
    if [ "$status" -eq 0 ]; then
      row "$name" "made on the CPU" "$status" $((SECONDS - started))
    else
      failures+=("$name"); row "$name" "FAILED (no data for the rows after it)" "$status" $((SECONDS - started))
      tail -n 8 "$out/$name.log" | sed 's/^/    /' | tee -a "$results"
    fi
    return $status
  fi
  if [ "$dry_run" = 1 ]; then
    local key="$*"
    if [ -n "${refused_before[$key]:-}" ]; then row "$name" "${refused_before[$key]} (as an earlier row: same command)" - 0; return 0; fi
    CUDA_VISIBLE_DEVICES= timeout 60 "$@" >"$out/$name.log" 2>&1
    local status=$? result
    if [[ $status == 77 || $status == 2 || $status == 1 ]] && grep -qiE "no CUDA GPU|needs a CUDA GPU" "$out/$name.log"; then
      result="refused cleanly"
    else
      result="UNEXPECTED (no clean refusal)"; failures+=("$name")
      tail -n 8 "$out/$name.log" | sed 's/^/    /' | tee -a "$results"
    fi
    refused_before[$key]="$result"
    row "$name" "$result" "$status" $((SECONDS - started))
    return 0
  fi
  local budget cap
  budget=$(left)
  cap=$((budget < ${ROW_CAP_S:-120} ? budget : ${ROW_CAP_S:-120}))
  if [ "$budget" -lt 5 ]; then row "$name" "skipped (budget)" - 0; failures+=("$name"); return 1; fi
  timeout -k 10 "$cap" "$@" >"$out/$name.log" 2>&1
  local status=$?
  if [ "$status" -eq 0 ]; then
    row "$name" ok "$status" $((SECONDS - started))
  else
    failures+=("$name")
    row "$name" "$([ "$status" -eq 124 ] && echo "timed out after $cap s" || echo FAILED)" "$status" $((SECONDS - started))
    tail -n 15 "$out/$name.log" | sed 's/^/    /' | tee -a "$results"
  fi
  return $status
}
# Row 0: the launcher finds the GPU (it links LibTorch's CPU parts only and asks the driver).
run_step launcher-sees-cuda "$bin/lightning-run" model --accelerator cuda --devices 1 --dry-run "$bin/lf_gpu_tests"
# The worker's CPUs under --numa-binding node are its GPU's NUMA node's.
run_step numa-binding-node bash "$root/scripts/device_numa_check.sh" "$bin"
run_step gpu-tests "$bin/lf_gpu_tests" --reporter compact
run_step nccl-train-world-1 "$bin/lightning-run" model --accelerator cuda --devices 1 --strategy ddp "$bin/lf_gpu_tests" "[nccl]"
for strategy in ddp fsdp; do
  run_step "nccl-collectives-$strategy" "$bin/lightning-run" model --accelerator cuda --devices 1 --strategy "$strategy" \
    "$bin/lf_collective_checks" "[$strategy]"
done
for precision in 32-true bf16-mixed 16-mixed; do
  run_step "step-time-$precision" "$bin/bench_step_time" --steps 200 --warmup 20 --batch-size 256 \
    --precision "$precision" --accelerator cuda
  grep -sh '"benchmark"' "$out/step-time-$precision.log" | tee -a "$results"
done
# P8: the same GPT-style model and batch, bf16-mixed, alternated in every round: the C++ GPT with
# LibTorch's AdamW step and with Fabric's fused step; the Python twin under Python Lightning Fabric
# with AdamW's default (foreach on CUDA) and with fused=True; and the same loop in plain PyTorch
# with fused=True. Round 1 runs all five and profiles one step of each (kernel counts); later
# rounds run the three the goals compare. After each round's C++ fused run, the CUDA-graph row runs
# the same command captured (lf::CapturedStep): the fused run is its eager side, with the same seed
# and batches, so the weights after training must agree (the profiled step comes after the weights
# are measured).
median() { sed -n 's/.*"median_step_ms": *\([0-9.e+-]*\).*/\1/p' "$1" 2>/dev/null | head -n 1; }
field() { sed -n "s/.*\"$2\": *\([0-9.e+-]*\).*/\1/p" "$1" 2>/dev/null | head -n 1; }
weights_l2() { sed -n 's/.*"weights_l2": *\([0-9.e+-]*\).*/\1/p' "$1" 2>/dev/null | head -n 1; }
declare -A p8_ms
p8_command() {  # p8_command VARIANT: the command line of one P8 variant
  case "$1" in
    cpp-libtorch) echo "$bin/gpt --accelerator cuda --precision bf16-mixed --no-progress --optimizer-step libtorch" ;;
    cpp-fused) echo "$bin/gpt --accelerator cuda --precision bf16-mixed --no-progress --optimizer-step fused" ;;
    python-default) echo "$python $root/scripts/p8_python_fabric.py --accelerator cuda --precision bf16-mixed" ;;
    python-fused) echo "$python $root/scripts/p8_python_fabric.py --accelerator cuda --precision bf16-mixed --fused" ;;
    plain-fused) echo "$python $root/scripts/p8_python_fabric.py --accelerator cuda --precision bf16-mixed --plain --fused" ;;
  esac
}
for round in $(seq "$p8_rounds"); do
  variants=(cpp-fused python-default plain-fused) profile=()
  [ "$round" -eq 1 ] && variants=(cpp-libtorch cpp-fused python-default python-fused plain-fused) profile=(--profile-step)
  for variant in "${variants[@]}"; do
    # shellcheck disable=SC2046
    run_step "p8-$variant-$round" $(p8_command "$variant") "${profile[@]}"
    grep -sh '"P8' "$out/p8-$variant-$round.log" | tee -a "$results"
    p8_ms[$variant-$round]="$(median "$out/p8-$variant-$round.log")"
    if [ "$variant" = cpp-fused ]; then
      # shellcheck disable=SC2046
      run_step "graph-captured-$round" $(p8_command cpp-fused) --cuda-graph
      grep -sh '"P8' "$out/graph-captured-$round.log" | tee -a "$results"
    fi
  done
done

fsdp_ac_command() {  # fsdp_ac_command cpp|python plain|checkpointed
  local ac=(); [ "$2" = checkpointed ] && ac=(--activation-checkpointing)
  case "$1" in
    cpp) echo "$bin/lightning-run model --accelerator cuda --devices 1 --strategy fsdp --precision bf16-mixed" \
      "$bin/gpt --no-progress --steps 20 --warmup 5 --fsdp-block-units ${ac[*]}" ;;
    python) echo "$python $root/scripts/p8_python_fabric.py --accelerator cuda --precision bf16-mixed --steps 20" \
      "--warmup 5 --fsdp ${ac[*]}" ;;
  esac
}
declare -A ac_ms ac_mem
for side in cpp python; do
  for mode in plain checkpointed; do
    run_step "fsdp-ac-$side-$mode" $(fsdp_ac_command "$side" "$mode")
    grep -sh '"P8 gpt' "$out/fsdp-ac-$side-$mode.log" | tee -a "$results"
    ac_ms[$side-$mode]="$(median "$out/fsdp-ac-$side-$mode.log")"
    ac_mem[$side-$mode]="$(field "$out/fsdp-ac-$side-$mode.log" cuda_peak_allocated_mb)"
  done
done

# Tensor parallel at world size 1: train and save a sharded checkpoint, then resume from it.
tp_checkpoint="$scratch/tp-checkpoint"
rm -rf "$tp_checkpoint"
tp_command=("$bin/lightning-run" model --accelerator cuda --devices 1 --strategy model_parallel "$bin/tensor_parallel_gpt"
  --steps 20 --log-every 10)
run_step tp-world-1-save "${tp_command[@]}" --checkpoint "$tp_checkpoint"
grep -sh '"example"' "$out/tp-world-1-save.log" | tee -a "$results"
if run_step tp-world-1-resume "${tp_command[@]}" --resume "$tp_checkpoint" && [ "$dry_run" = 0 ] &&
  [ -f "$out/tp-world-1-resume.log" ] && ! grep -q "resumed from .* at step 20" "$out/tp-world-1-resume.log"; then
  failures+=(tp-world-1-resume); say "    tp-world-1-resume: no 'resumed from ... at step 20' line"
fi
grep -sh '"example"' "$out/tp-world-1-resume.log" | tee -a "$results"
tp_fsdp_checkpoint="$scratch/tp-fsdp-checkpoint"
rm -rf "$tp_fsdp_checkpoint"
tp_fsdp_command=("$bin/lightning-run" model --accelerator cuda --devices 1 "$bin/tensor_parallel_gpt" --steps 10
  --log-every 5 --tensor-parallel-size 1 --sequence-parallel --dropout 0.1)
run_step tp-fsdp-world-1-save "${tp_fsdp_command[@]}" --data-parallel fsdp --checkpoint "$tp_fsdp_checkpoint"
grep -sh '"example"' "$out/tp-fsdp-world-1-save.log" | tee -a "$results"
if run_step tp-fsdp-world-1-resume-ddp "${tp_fsdp_command[@]}" --data-parallel ddp --resume "$tp_fsdp_checkpoint" &&
  [ "$dry_run" = 0 ] && [ -f "$out/tp-fsdp-world-1-resume-ddp.log" ] &&
  ! grep -q "resumed from .* at step 10" "$out/tp-fsdp-world-1-resume-ddp.log"; then
  failures+=(tp-fsdp-world-1-resume-ddp); say "    tp-fsdp-world-1-resume-ddp: no 'resumed from ... at step 10' line"
fi
grep -sh '"example"' "$out/tp-fsdp-world-1-resume-ddp.log" | tee -a "$results"
# The composed strategy's HSDP data part on CUDA (mesh replicate 1 x shard 1 x tensor 1: the
# hybrid code path, its two groups of one on NCCL), the blocks through the context region's calls.
run_step tp-hsdp-world-1 "$bin/lightning-run" model --accelerator cuda --devices 1 "$bin/tensor_parallel_gpt" --steps 10 \
  --log-every 5 --tensor-parallel-size 1 --data-parallel hsdp
grep -sh '"example"' "$out/tp-hsdp-world-1.log" | tee -a "$results"

# Streaming data on the GPU: the image classifier trains from a streaming dataset (uint8 tensors:
# this build may lack the JPEG decoder), its batches read ahead into pinned memory. The machine has
# neither Fashion-MNIST nor litdata, so the rows before it make the data: synthetic idx files
# (python3's standard library), then the classifier's --write-data (lf::StreamingWriter) turns
# them into a streaming dataset. The training also reads the idx files' test split.
stream_idx="$scratch/stream-idx"
stream_dir="$scratch/stream-data"
rm -rf "$stream_idx" "$stream_dir"
idx_size=()
[ "$dry_run" = 1 ] && idx_size=(--train 512 --test 256)  # the dry run proves the rows, not the data's size
make_data streaming-data-idx "$python" "$root/scripts/synthetic_fashion_mnist.py" "$stream_idx" "${idx_size[@]}"
make_data streaming-data-write "$bin/image_classifier" --data-dir "$stream_idx" --write-data "$stream_dir" --data-format tensor
grep -sh '^wrote' "$out/streaming-data-idx.log" "$out/streaming-data-write.log" | tee -a "$results"
run_step streaming-train-cuda "$bin/image_classifier" --data "$stream_dir" --data-dir "$stream_idx" --accelerator cuda \
  --epochs 1 --no-progress
grep -sh '"data_wait_seconds"' "$out/streaming-train-cuda.log" | tee -a "$results"

say ""
say "## rows"
say "| row | result | exit | s |"
say "| --- | --- | --- | --- |"
for entry in "${rows[@]}"; do IFS='|' read -r name result code seconds <<<"$entry"; say "| $name | $result | $code | $seconds |"; done
if [ "$dry_run" = 1 ]; then
  if [ ${#failures[@]} -eq 0 ]; then say "- dry run: all ${#rows[@]} rows resolve and refuse cleanly without a GPU (the data rows made their data)"; exit 0; fi
  say "- dry run FAILED: ${failures[*]}"; exit 1
fi
say ""
say "## summary"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") print "n/a"; else printf "%.3f", a / b }'; }
for round in $(seq "$p8_rounds"); do
  fused="${p8_ms[cpp-fused-$round]:-}"
  if [ "$round" -eq 1 ]; then
    say "- P8 round $round (ms): C++ LibTorch step ${p8_ms[cpp-libtorch-$round]:-n/a}, C++ fused ${fused:-n/a}," \
      "Python Fabric default ${p8_ms[python-default-$round]:-n/a}, Python Fabric fused ${p8_ms[python-fused-$round]:-n/a}," \
      "plain PyTorch fused ${p8_ms[plain-fused-$round]:-n/a}"
  else
    say "- P8 round $round (ms): C++ fused ${fused:-n/a}, Python Fabric default ${p8_ms[python-default-$round]:-n/a}," \
      "plain PyTorch fused ${p8_ms[plain-fused-$round]:-n/a}"
  fi
  say "  - C++ fused / Python Fabric default: $(ratio "$fused" "${p8_ms[python-default-$round]:-}") (goal <= 0.90);" \
    "C++ fused / plain PyTorch fused: $(ratio "$fused" "${p8_ms[plain-fused-$round]:-}") (goal <= 1.00)"
done
say "- FLOPs per step: C++ lf::measure_flops $(field "$out/p8-cpp-fused-1.log" measured_flops_per_step)," \
  "Python measure_flops $(field "$out/p8-python-default-1.log" measured_flops_per_step); C++ MFU (fused step)" \
  "$(field "$out/p8-cpp-fused-1.log" mfu) against the dense bf16 peak (lf::available_flops)"
for round in $(seq "$p8_rounds"); do
  eager="$out/p8-cpp-fused-$round.log" captured="$out/graph-captured-$round.log"
  e="$(median "$eager")"; c="$(median "$captured")"
  we="$(weights_l2 "$eager")"; wc="$(weights_l2 "$captured")"
  agree="$(awk -v a="$we" -v b="$wc" 'BEGIN { if (a == "" || b == "") print "n/a"; else { d = (a - b) / a; if (d < 0) d = -d; printf "%s (relative difference %.2e)", (d <= 1e-3 ? "yes" : "NO"), d } }')"
  say "- CUDA graph round $round: eager (p8-cpp-fused-$round) ${e:-n/a} ms, captured ${c:-n/a} ms, steps/s captured over eager $(ratio "$e" "$c"); weights agree: $agree"
done
say "- fsdp + activation checkpointing (ms, plain -> checkpointed): C++ ${ac_ms[cpp-plain]:-n/a} ->" \
  "${ac_ms[cpp-checkpointed]:-n/a} ($(ratio "${ac_ms[cpp-checkpointed]:-}" "${ac_ms[cpp-plain]:-}")x), Python Fabric" \
  "${ac_ms[python-plain]:-n/a} -> ${ac_ms[python-checkpointed]:-n/a} ($(ratio "${ac_ms[python-checkpointed]:-}" "${ac_ms[python-plain]:-}")x);" \
  "C++ checkpointed / Python checkpointed $(ratio "${ac_ms[cpp-checkpointed]:-}" "${ac_ms[python-checkpointed]:-}");" \
  "Python peak CUDA memory ${ac_mem[python-plain]:-n/a} -> ${ac_mem[python-checkpointed]:-n/a} MB"
if [ ${#failures[@]} -eq 0 ]; then
  say "- all steps passed in ${SECONDS} s"
else
  say "- FAILED: ${failures[*]} (${SECONDS} s)"
  exit 1
fi
