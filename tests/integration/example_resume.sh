#!/usr/bin/env bash
# The image classifier stopped at step 20 and resumed from its checkpoint reaches step 40 with
# exactly the weights and optimizer state of an uninterrupted 40-step run.
# Usage: example_resume.sh IMAGE_CLASSIFIER CHECKPOINT_TOOL [LAUNCHER_PREFIX...]
set -euo pipefail
example="$1"; tool="$2"; shift 2
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
run() { "$@" "$example" --batch-size 32 --accelerator cpu "${args[@]}"; }
args=(--max-steps 40 --checkpoint-dir "$dir/straight"); run "$@" >/dev/null
args=(--max-steps 20 --checkpoint-dir "$dir/split"); run "$@" >/dev/null
args=(--max-steps 40 --checkpoint-dir "$dir/split" --resume "$dir/split/epoch=1-step=20.ckpt"); run "$@" >"$dir/log"
grep -q "resumed from" "$dir/log" || { cat "$dir/log"; echo "FAIL: no resume message"; exit 1; }
ls "$dir/straight" "$dir/split"
"$tool" same "$dir/straight/epoch=1-step=40.ckpt" "$dir/split/epoch=1-step=40.ckpt" model
"$tool" same "$dir/straight/epoch=1-step=40.ckpt" "$dir/split/epoch=1-step=40.ckpt" optimizer 2>/dev/null ||
  { echo "FAIL: optimizer state differs"; exit 1; }
