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
expect 2 "no .metadata" -- "$dir/plain" || failed=1
expect 2 "memory:// objects live only inside a running job" -- memory://snapshot-000000000001 || failed=1
touch "$dir/taken.pt"
expect 2 "already exists" -- "$dir/ck" --output-file "$dir/taken.pt" || failed=1
cp -r "$dir/ck" "$dir/missing-shard" && rm "$dir/missing-shard/__1_0.distcp"
expect 1 "__1_0.distcp (holding model." -- "$dir/missing-shard" || failed=1
cp -r "$dir/ck" "$dir/truncated" && truncate -s 100 "$dir/truncated/__1_0.distcp"
expect 1 "truncated" -- "$dir/truncated" || failed=1
cp -r "$dir/ck" "$dir/corrupted"
# Four bytes inside the tensor record of rank 1's first item, a torch.save archive at offset 0
# of its file (the zip's alignment padding is not checksummed).
offset=$(python3 - "$dir/corrupted/__1_0.distcp" <<'PY'
import io, struct, sys, zipfile
data = open(sys.argv[1], "rb").read()
end = data.index(b"PK\x05\x06") + 22  # the first archive's end record
archive = zipfile.ZipFile(io.BytesIO(data[:end]))
info = archive.getinfo(next(n for n in archive.namelist() if "/data/" in n))
name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
print(info.header_offset + 30 + name_length + extra_length)
PY
)
printf '\x5a\xa5\x5a\xa5' | dd of="$dir/corrupted/__1_0.distcp" bs=1 seek="$offset" conv=notrunc status=none
expect 1 "is corrupted" -- "$dir/corrupted" || failed=1
[ ! -e "$dir/missing-shard.consolidated" ] && [ ! -e "$dir/truncated.consolidated" ] &&
  [ ! -e "$dir/corrupted.consolidated" ] ||
  { echo "FAIL: a failed consolidation left an output file"; failed=1; }
expect 0 "consolidated" -- "$dir/ck/" || failed=1
[ -f "$dir/ck.consolidated" ] || { echo "FAIL: default output DIR.consolidated missing"; failed=1; }
exit "$failed"
