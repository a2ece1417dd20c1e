#!/usr/bin/env bash
# A writer killed with SIGKILL in the middle of saving a large checkpoint leaves the previous
# file intact and loadable. Usage: checkpoint_killed_mid_save.sh CHECKPOINT_TOOL
set -euo pipefail
tool="$1"
dir="$(mktemp -d)"
trap 'kill -9 "${writer:-0}" 2>/dev/null || true; rm -rf "$dir"' EXIT
for attempt in 1 2 3; do
  rm -f "$dir"/* "$dir"/.[!.]* 2>/dev/null || true
  "$tool" loop "$dir/last.ckpt" 96 >"$dir/log" 2>&1 &
  writer=$!
  for _ in $(seq 600); do grep -q "saved 2" "$dir/log" && break; sleep 0.05; done
  grep -q "saved 2" "$dir/log" || { cat "$dir/log"; echo "FAIL: the writer did not save twice"; exit 1; }
  # Kill while the next save is writing its temporary file (after a random extra delay).
  for _ in $(seq 2000); do compgen -G "$dir/.last.ckpt.tmp-*" >/dev/null && break; sleep 0.005; done
  sleep "0.0$((RANDOM % 5))"
  kill -9 "$writer"
  wait "$writer" 2>/dev/null || true
  last_saved="$(grep -c saved "$dir/log")"
  echo "attempt $attempt: killed after $last_saved completed saves; files: $(ls -A "$dir" | tr '\n' ' ')"
  compgen -G "$dir/.last.ckpt.tmp-*" >/dev/null || echo "note: the kill landed between two writes"
  "$tool" check "$dir/last.ckpt"
  version="$("$tool" check "$dir/last.ckpt" | sed -n 's/intact version //p')"
  [ "$version" -ge "$last_saved" ] || { echo "FAIL: version $version older than the last completed save $last_saved"; exit 1; }
done
echo "the previous checkpoint survived every kill"
