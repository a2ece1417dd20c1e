#!/usr/bin/env bash
# Every example under lightning-run, once with --precision bf16-mixed and once with --devices 2: an
# example leaves unset what its user did not set, so the launcher's flags apply without conflict.
# Usage: examples_under_lightning_run.sh LIGHTNING_RUN BIN_DIR
set -uo pipefail
run="$1"; bin="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1
# A few steps of each, and where it prints one, the line that shows it ran to the end.
declare -A args=(
  [image_classifier]="--max-steps 3"
  [build_your_own_trainer]="--max-epochs 1 --limit-train-batches 2 --limit-val-batches 1 --checkpoint-dir $dir/ck-@"
  [dcgan]="--max-steps 2 --batch-size 8 --sync-batchnorm --output-dir $dir/gan-@"  # lf::SyncBatchNorm over 2 ranks
  [autoencoder]="--max-steps 3"
  [layerwise_lr]="--max-steps 3"
  [gpt]="--layers 1 --d-model 32 --heads 2 --seq 16 --vocab 64 --batch-size 2 --steps 2 --warmup 1"
)
failures=0
for example in image_classifier build_your_own_trainer dcgan autoencoder layerwise_lr gpt; do
  for flags in "--precision bf16-mixed" "--devices 2"; do
    tag="${flags//[^a-z0-9]/}"
    # shellcheck disable=SC2086  # the flag strings split on purpose
    "$run" model --accelerator cpu $flags "$bin/$example" ${args[$example]//@/$tag} >"$dir/$example-$tag.log" 2>&1
    status=$?
    if [ "$status" -ne 0 ]; then
      echo "FAIL: lightning-run model --accelerator cpu $flags $example exited $status:"
      tail -n 15 "$dir/$example-$tag.log"
      failures=$((failures + 1))
    else
      echo "ok: $example under lightning-run $flags"
    fi
  done
done
[ "$failures" -eq 0 ] || exit 1
