#!/usr/bin/env bash
# Progress display of the examples: plain lines on stderr off a terminal, a bar redrawn in place on
# a terminal (a pty from script(1)), the same through lightning-run on a terminal, nothing with
# --no-progress, and stdout holding only the per-epoch JSON lines throughout.
# Usage: progress_output.sh LIGHTNING_RUN IMAGE_CLASSIFIER
set -uo pipefail
run="$1"; example="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
json_only() {  # every stdout line is a JSON object with rounded numbers
  grep -q . "$1" || fail "no JSON line on stdout"
  while IFS= read -r line; do
    [[ "$line" == "{"*"}" ]] || fail "stdout holds a non-JSON line: $line"
  done <"$1"
  grep -Eq '"seconds":[0-9]+(\.[0-9])?[,}]' "$1" || fail "seconds not rounded to 0.1: $(cat "$1")"
  grep -Eq '"train_loss":[0-9]+(\.[0-9]{1,4})?[,}]' "$1" || fail "train_loss not rounded to 4 decimals: $(cat "$1")"
}

# Off a terminal: plain lines on stderr, no carriage returns.
"$example" --accelerator cpu --max-steps 5 >"$dir/out" 2>"$dir/err" || fail "the plain run failed: $(tail "$dir/err")"
cat "$dir/err"
json_only "$dir/out"
grep -q "^epoch 1: 5/" "$dir/err" || fail "no final training progress line on stderr"
grep -q "loss " "$dir/err" || fail "the progress line shows no loss"
grep -q "^test: 10/10 (100%)" "$dir/err" || fail "no evaluation progress line"
! grep -q $'\r' "$dir/err" || fail "carriage returns off a terminal"
echo "ok: plain form"

# --no-progress: stderr stays quiet.
"$example" --accelerator cpu --max-steps 5 --no-progress >"$dir/out" 2>"$dir/err" || fail "the --no-progress run failed"
! grep -q "epoch 1:" "$dir/err" || fail "--no-progress still shows progress"
json_only "$dir/out"
echo "ok: --no-progress"

# On a terminal: the bar redraws in place (\r and erase-line), and stdout is still the JSON.
script -qec "'$example' --accelerator cpu --max-steps 5 >'$dir/out'" /dev/null >"$dir/tty" </dev/null ||
  fail "the terminal run failed: $(cat "$dir/tty")"
grep -q $'\r\033\\[Kepoch 1: #' "$dir/tty" || fail "no bar redrawn in place on a terminal: $(cat -v "$dir/tty" | head -c 600)"
json_only "$dir/out"
echo "ok: terminal form"

# Through lightning-run on a terminal: rank 0's bar is forwarded in place, tagged; rank 1 is quiet.
script -qec "'$run' model --accelerator cpu --devices 2 --log-dir '$dir/logs' '$example' --max-steps 5" /dev/null >"$dir/tty" </dev/null ||
  fail "the lightning-run terminal run failed: $(cat -v "$dir/tty" | tail -c 800)"
grep -q $'\r\033\\[K\\[rank 0\\]: epoch 1: #' "$dir/tty" || fail "lightning-run did not forward the bar: $(cat -v "$dir/tty" | head -c 800)"
! grep -q "\[rank 1\]: .*epoch 1:" "$dir/tty" || fail "rank 1 shows progress"
grep -q '\[rank 0\]: {"epoch":1' "$dir/tty" || fail "no JSON line from rank 0"
echo "ok: terminal form through lightning-run"
# The log file keeps complete lines only: the final bar, no redraws, no control codes.
log="$dir/logs/attempt_0/rank_0.stderr"
grep -q "^epoch 1: #################### 5/5 (100%)" "$log" || fail "the log lacks the final bar line: $(cat -v "$log")"
! grep -q $'[\r\033]' "$log" || fail "the log holds redraws or control codes: $(cat -v "$log")"
[ "$(grep -c "^epoch 1:" "$log")" = 1 ] || fail "the log holds more than the final training bar: $(cat -v "$log")"
echo "ok: the log keeps the final line only"
