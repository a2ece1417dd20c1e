#!/usr/bin/env bash
# The tensor-parallel GPT example as its header documents it, with every flag: the mesh from
# `lightning-run --strategy model_parallel`; then (2, 2) with fsdp on the data dimension, sequence
# parallelism and dropout, saving a sharded checkpoint that resumes under (context 2, tensor 2) with
# ddp (context parallelism: each rank half of every sequence, ring attention). Each run
# must print its JSON line with a finite loss; under fsdp rank 0's parameter and AdamW bytes must
# be within 1.10 of the formula's (split / T + replicated, / D).
#   example_tensor_parallel_gpt.sh LIGHTNING_RUN TENSOR_PARALLEL_GPT
set -euo pipefail
run="$1" gpt="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
small=(--vocab 64 --seq 16 --d-model 32 --heads 4 --layers 2 --batch-size 8 --warmup 1 --log-every 3)

json_field() {  # FILE FIELD
  grep -o "\"$2\":[^,}]*" "$1" | head -1 | cut -d: -f2 | tr -d '"'
}

"$run" model --accelerator cpu --devices 4 --strategy model_parallel "$gpt" "${small[@]}" --steps 4 \
  > "$work/flag.log" || fail "the example under --strategy model_parallel failed"
grep -q '"example":"tensor_parallel_gpt","strategy":"model_parallel","world_size":4,"data":1,"tensor":4' "$work/flag.log" \
  || fail "no JSON line for mesh (1, 4): $(tail -3 "$work/flag.log")"

"$run" model --accelerator cpu --devices 4 "$gpt" "${small[@]}" --steps 6 --tensor-parallel-size 2 --data-parallel fsdp \
  --sequence-parallel --dropout 0.1 --checkpoint "$work/ck" > "$work/fsdp.log" || fail "the fsdp x tp run failed"
grep -q '"data":2,"tensor":2' "$work/fsdp.log" || fail "no JSON line for mesh (2, 2): $(tail -3 "$work/fsdp.log")"
[ -f "$work/ck/.metadata" ] || fail "no sharded checkpoint at $work/ck"
python3 - "$(json_field "$work/fsdp.log" loss)" "$(json_field "$work/fsdp.log" parameter_bytes)" \
  "$(json_field "$work/fsdp.log" formula_parameter_bytes)" "$(json_field "$work/fsdp.log" optimizer_bytes)" \
  "$(json_field "$work/fsdp.log" formula_optimizer_bytes)" <<'PY' || fail "the fsdp x tp run's loss or memory is off"
import math, sys
loss, parameters, formula, optimizer, optimizer_formula = map(float, sys.argv[1:])
assert math.isfinite(loss), loss
assert parameters <= 1.10 * formula, (parameters, formula)
assert optimizer <= 1.10 * optimizer_formula, (optimizer, optimizer_formula)
print(f"fsdp x tp: parameters {parameters / formula:.3f} x the formula, AdamW state {optimizer / optimizer_formula:.3f} x")
PY

"$run" model --accelerator cpu --devices 4 "$gpt" "${small[@]}" --steps 3 --tensor-parallel-size 2 --data-parallel ddp \
  --context-parallel-size 2 --resume "$work/ck" > "$work/resume.log" || fail "resuming under (context 2, tensor 2) with ddp failed"
grep -q "resumed from $work/ck at step 6" "$work/resume.log" || fail "the resume did not start at step 6"
grep -q '"data":1,"tensor":2,"context":2' "$work/resume.log" || fail "no JSON line after the resume"
echo "tensor parallel GPT example passed"
