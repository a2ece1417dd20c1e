#!/usr/bin/env bash
# The image classifier's streaming mode: --write-data writes Fashion-MNIST's training set as a
# JPEG streaming dataset (60,000 items); --data trains from it on 2 ranks under lightning-run and
# reports how long the loop waited for data. A second --write-data into the folder is refused.
# Usage: example_streaming.sh LIGHTNING_RUN IMAGE_CLASSIFIER
set -uo pipefail
run="$1"; classifier="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$classifier" --write-data "$dir/fmnist" --data-format jpeg > "$dir/write.out" 2>&1 || fail "--write-data exited with $? ($(tail -2 "$dir/write.out"))"
grep -q "wrote 60000 items" "$dir/write.out" || fail "--write-data did not write 60000 items: $(cat "$dir/write.out")"
[ -f "$dir/fmnist/index.json" ] || fail "no index.json"
timeout 240 "$run" model --accelerator cpu --devices 2 "$classifier" --data "$dir/fmnist" --max-steps 40 --batch-size 32 \
  --no-progress > "$dir/train.out" 2>&1 || fail "training from --data exited with $? ($(tail -3 "$dir/train.out"))"
line=$(grep '"data_wait_seconds"' "$dir/train.out") || fail "no JSON line with data_wait_seconds: $(tail -3 "$dir/train.out")"
echo "$line"
echo "$line" | grep -q '"steps":40' || fail "the streamed run did not take 40 steps"
echo "$line" | grep -q '"world_size":2' || fail "the streamed run was not on 2 ranks"
code=0; "$classifier" --write-data "$dir/fmnist" > "$dir/again.out" 2>&1 || code=$?
(( code == 1 )) || fail "a second --write-data into the folder exited with $code, expected 1"
grep -q "already holds a dataset" "$dir/again.out" || fail "the refusal does not say why: $(cat "$dir/again.out")"
echo "streamed image classifier passed"
