#!/usr/bin/env bash
# Reads back the TensorBoard event file our logger writes, independently of our code: first with
# TensorBoard's own reader (the tensorboard package of LF_PYTHON), then byte by byte: the TFRecord
# framing and masked CRC-32Cs are checked by a bitwise CRC in Python (standard library only), and
# each record is decoded by protoc --decode_raw. Usage: tensorboard_reader.sh UNIT_TESTS
set -euo pipefail
tests="$1"
source "$(dirname "${BASH_SOURCE[0]}")/../missing.sh"
command -v protoc >/dev/null || missing "protoc missing (scripts/install-deps.sh installs protobuf-compiler)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
LF_TB_DIR="$dir" "$tests" "[tensorboard-writer]" >"$dir/log"
file="$(sed -n 's/^event_file //p' "$dir/log")"
[ -f "$file" ] || { cat "$dir/log"; echo "FAIL: no event file"; exit 1; }
python="${LF_PYTHON:-python3}"
"$python" - "$file" <<'PY' || { echo "FAIL: TensorBoard's reader disagrees"; exit 1; }
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
events = EventAccumulator(sys.argv[1])
events.Reload()
tags = sorted(events.Tags()["scalars"])
assert tags == ["acc", "loss"], tags
loss = [(e.step, e.value) for e in events.Scalars("loss")]
acc = [(e.step, e.value) for e in events.Scalars("acc")]
assert loss == [(10, 0.5), (20, 0.125)], loss
assert acc == [(10, 0.25)], acc
print("TensorBoard's EventAccumulator reads", tags, loss, acc)
PY
/usr/bin/python3 - "$file" "$dir" <<'PY'
import struct, sys
def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
blob = open(sys.argv[1], "rb").read()
at, count = 0, 0
while at < len(blob):
    header = blob[at:at + 8]
    (length,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", blob[at + 8:at + 12])
    assert header_crc == masked(header), "FAIL: length CRC of record %d" % count
    record = blob[at + 12:at + 12 + length]
    (record_crc,) = struct.unpack("<I", blob[at + 12 + length:at + 16 + length])
    assert record_crc == masked(record), "FAIL: data CRC of record %d" % count
    open("%s/record%d.bin" % (sys.argv[2], count), "wb").write(record)
    at += 16 + length
    count += 1
assert count == 3, "FAIL: %d records, expected 3" % count
print("framing and CRCs of %d records verified" % count)
PY
protoc --decode_raw <"$dir/record0.bin" | tee "$dir/r0.txt"
protoc --decode_raw <"$dir/record1.bin" | tee "$dir/r1.txt"
protoc --decode_raw <"$dir/record2.bin" | tee "$dir/r2.txt"
grep -q '3: "brain.Event:2"' "$dir/r0.txt" || { echo "FAIL: first record is not the file_version event"; exit 1; }
# step 10 with loss 0.5 (float bits 0x3f000000) and acc 0.25 (0x3e800000); step 20 with loss 0.125.
grep -q '^2: 10$' "$dir/r1.txt" && grep -q '1: "loss"' "$dir/r1.txt" && grep -q '2: 0x3f000000' "$dir/r1.txt" &&
  grep -q '1: "acc"' "$dir/r1.txt" && grep -q '2: 0x3e800000' "$dir/r1.txt" ||
  { echo "FAIL: record 1 does not hold step 10, loss 0.5, acc 0.25"; exit 1; }
grep -q '^2: 20$' "$dir/r2.txt" && grep -q '2: 0x3e000000' "$dir/r2.txt" ||
  { echo "FAIL: record 2 does not hold step 20, loss 0.125"; exit 1; }
echo "the event file decodes to the logged values"
