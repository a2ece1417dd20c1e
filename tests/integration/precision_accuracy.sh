#!/usr/bin/env bash
# bf16-mixed trains the image classifier to within 1 point of 32-true test accuracy (same seed,
# same 300 steps of batch 64 on the real Fashion-MNIST data). Usage: precision_accuracy.sh BINARY
set -euo pipefail
shopt -s inherit_errexit  # a failing example inside $(accuracy ...) fails the script
binary="$1"
accuracy() {
  local line
  line="$("$binary" --max-steps 300 --batch-size 64 --accelerator cpu --precision "$1" | tail -n 1)"
  echo "$1: $line" >&2
  sed -n 's/.*"test_accuracy":\([0-9.]*\).*/\1/p' <<<"$line"
}
full="$(accuracy 32-true)"
mixed="$(accuracy bf16-mixed)"
[ -n "$full" ] && [ -n "$mixed" ] || { echo "no test_accuracy in the example's output" >&2; exit 1; }
awk -v a="$full" -v b="$mixed" 'BEGIN {
  d = a - b; if (d < 0) d = -d
  printf "32-true %.4f, bf16-mixed %.4f, difference %.2f points\n", a, b, 100 * d
  exit (a > 0.7 && 100 * d <= 1.0) ? 0 : 1
}'
