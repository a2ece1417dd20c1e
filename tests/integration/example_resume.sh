#!/usr/bin/env bash
# An example stopped at step 20 and resumed from its checkpoint reaches step 40 with exactly the
# weights and optimizer state of an uninterrupted 40-step run.
# Usage: example_resume.sh flag|last|auto EXAMPLE CHECKPOINT_TOOL [LAUNCHER_PREFIX...]
#   flag: resume with --resume DIR/epoch=1-step=20.ckpt (image_classifier)
#   last: every run passes --resume last, which starts afresh in an empty folder (image_classifier)
#   auto: run again with the same --checkpoint-dir (build_your_own_trainer resumes by itself)
set -euo pipefail
mode="$1"; example="$2"; tool="$3"; shift 3
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
extra=()
[ "$mode" = last ] && extra=(--resume last)
run() { "$@" "$example" --batch-size 32 --accelerator cpu "${args[@]}" "${extra[@]}"; }
args=(--max-steps 40 --checkpoint-dir "$dir/straight"); run "$@" >/dev/null
args=(--max-steps 20 --checkpoint-dir "$dir/split"); run "$@" >/dev/null
args=(--max-steps 40 --checkpoint-dir "$dir/split")
[ "$mode" = flag ] && args+=(--resume "$(ls -d "$dir"/split/*step=20.ckpt)")
run "$@" >"$dir/log"
grep -q "resumed from" "$dir/log" || { cat "$dir/log"; echo "FAIL: no resume message"; exit 1; }
ls "$dir/straight" "$dir/split"
straight="$(ls -d "$dir"/straight/*step=40.ckpt)"
split="$(ls -d "$dir"/split/*step=40.ckpt)"
"$tool" same "$straight" "$split" model
"$tool" same "$straight" "$split" optimizer || { echo "FAIL: optimizer state differs"; exit 1; }
