#!/usr/bin/env bash
# Every way `lightning-run model consolidate` refuses its input: message and exit code.
# Usage: consolidate_errors.sh LIGHTNING_RUN FSDP_CHECKS
set -uo pipefail
run="$1"; checks="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
expect() {  # expect CODE TEXT -- ARGS...
  local code="$1" text="$2"; shift 3
  local output status
  output="$("$run" model consolidate "$@" 2>&1)"; status=$?
  if [ "$status" -ne "$code" ] || ! grep -qF -- "$text" <<<"$output"; then
    echo "FAIL: consolidate $* exited $status (expected $code) with: $output (expected to mention: $text)"
    return 1
  fi
  echo "ok ($status): consolidate $* -> $(head -n 1 <<<"$output")"
}
"$run" model --accelerator cpu --devices 2 "$checks" save FULL_SHARD "$dir" >/dev/null || { echo "FAIL: could not save"; exit 1; }
failed=0
expect 2 "required" -- || failed=1
expect 2 "does not exist" -- "$dir/missing" || failed=1
expect 2 "is a file" -- "$dir/reference.pt" || failed=1
mkdir "$dir/plain"
expect 2 "no metadata.json" -- "$dir/plain" || failed=1
touch "$dir/taken.pt"
expect 2 "already exists" -- "$dir/ck" --output-file "$dir/taken.pt" || failed=1
cp -r "$dir/ck" "$dir/missing-shard" && rm "$dir/missing-shard/shard-1-of-2.pt"
expect 1 "shard-1-of-2.pt is missing" -- "$dir/missing-shard" || failed=1
cp -r "$dir/ck" "$dir/truncated" && truncate -s 100 "$dir/truncated/shard-0-of-2.pt"
expect 1 "truncated" -- "$dir/truncated" || failed=1
cp -r "$dir/ck" "$dir/corrupted"
# Four bytes inside the first tensor record (the zip's alignment padding is not checksummed).
offset=$(python3 - "$dir/corrupted/shard-0-of-2.pt" <<'PY'
import struct, sys, zipfile
name = next(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if "/data/" in n)
info = zipfile.ZipFile(sys.argv[1]).getinfo(name)
header = open(sys.argv[1], "rb").read()[info.header_offset:info.header_offset + 30]
name_length, extra_length = struct.unpack("<HH", header[26:30])
print(info.header_offset + 30 + name_length + extra_length)
PY
)
printf '\x5a\xa5\x5a\xa5' | dd of="$dir/corrupted/shard-0-of-2.pt" bs=1 seek="$offset" conv=notrunc status=none
expect 1 "is corrupted" -- "$dir/corrupted" || failed=1
[ ! -e "$dir/missing-shard.consolidated" ] && [ ! -e "$dir/truncated.consolidated" ] &&
  [ ! -e "$dir/corrupted.consolidated" ] ||
  { echo "FAIL: a failed consolidation left an output file"; failed=1; }
expect 0 "consolidated" -- "$dir/ck/" || failed=1
[ -f "$dir/ck.consolidated" ] || { echo "FAIL: default output DIR.consolidated missing"; failed=1; }
exit "$failed"
