#!/usr/bin/env bash
# A writer killed with SIGKILL in the middle of saving a large checkpoint leaves the previous
# file intact and loadable. Usage: checkpoint_killed_mid_save.sh CHECKPOINT_TOOL
set -euo pipefail
tool="$1"
dir="$(mktemp -d)"
trap 'kill -9 "${writer:-0}" 2>/dev/null || true; rm -rf "$dir"' EXIT
# A kill counts as mid-write when the writer's temporary file is still there after it: the writer
# died after opening it and before its commit (the rename). At least 2 of the attempts must be such
# kills (a kill that lands between two saves still checks the file, but proves less).
mid_write=0
attempt=0
while [ "$mid_write" -lt 2 ]; do
  attempt=$((attempt + 1))
  [ "$attempt" -le 10 ] || { echo "FAIL: only $mid_write of 10 kills landed during a write"; exit 1; }
  rm -f "$dir"/* "$dir"/.[!.]* 2>/dev/null || true
  "$tool" loop "$dir/last.ckpt" 96 >"$dir/log" 2>&1 &
  writer=$!
  for _ in $(seq 600); do grep -q "saved 2" "$dir/log" && break; sleep 0.05; done
  grep -q "saved 2" "$dir/log" || { cat "$dir/log"; echo "FAIL: the writer did not save twice"; exit 1; }
  # Kill while the next save is writing its temporary file (after a random extra delay).
  for _ in $(seq 2000); do compgen -G "$dir/.last.ckpt.tmp-*" >/dev/null && break; sleep 0.005; done
  compgen -G "$dir/.last.ckpt.tmp-*" >/dev/null || { cat "$dir/log"; echo "FAIL: no save in progress seen"; exit 1; }
  sleep "0.0$((RANDOM % 5))"
  kill -9 "$writer"
  status=0
  wait "$writer" 2>/dev/null || status=$?
  [ "$status" -eq 137 ] || { cat "$dir/log"; echo "FAIL: the writer ended with $status before the kill"; exit 1; }
  last_saved="$(grep -c saved "$dir/log")"
  echo "attempt $attempt: killed after $last_saved completed saves; files: $(ls -A "$dir" | tr '\n' ' ')"
  if compgen -G "$dir/.last.ckpt.tmp-*" >/dev/null; then
    mid_write=$((mid_write + 1))
  else
    echo "note: the kill landed between two writes"
  fi
  "$tool" check "$dir/last.ckpt"
  version="$("$tool" check "$dir/last.ckpt" | sed -n 's/intact version //p')"
  [ "$version" -ge "$last_saved" ] || { echo "FAIL: version $version older than the last completed save $last_saved"; exit 1; }
done
echo "the previous checkpoint survived every kill; $mid_write of $attempt kills landed during a write"
