#!/usr/bin/env bash
# Background saves seen from outside a 2-rank job (modes: background_save_checks.cpp):
#   1. save_in_background writes the same bytes as fabric.save;
#   2. training runs while it writes, and the checkpoint holds the state of the save call;
#   3. kill -9 during the write leaves the previous checkpoint whole, and nothing else that loads;
#   4. an unwritable target (read-only folder; full disk) is one clear error on every rank, with
#      nothing left behind.
# Usage: background_save.sh LIGHTNING_RUN BACKGROUND_SAVE_CHECKS STRATEGY
set -euo pipefail
run="$1"
checks="$2"
strategy="$3"
dir="$(mktemp -d)"
cleanup() {
  pkill -9 -f "$checks hang $strategy $dir" 2>/dev/null || true
  chmod -R u+w "$dir" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
job() { "$run" model --accelerator cpu --devices 2 "$checks" "$@"; }

mkdir "$dir/same"
job same "$strategy" "$dir/same"
diff -r "$dir/same/sync" "$dir/same/background" || { echo "FAIL: the background save's bytes differ from fabric.save's"; exit 1; }
echo "save_in_background wrote the same bytes as fabric.save: $(cd "$dir/same" && find background -type f -printf '%p %s B; ')"

mkdir "$dir/continues"
job continues "$strategy" "$dir/continues"
[ -e "$dir/continues/at-exit" ] || { echo "FAIL: the save left in flight at exit was not completed"; exit 1; }
[ "$strategy" != fsdp ] || [ -f "$dir/continues/at-exit/.metadata" ] || { echo "FAIL: the folder completed at exit has no .metadata"; exit 1; }

mkdir "$dir/kill"
job hang "$strategy" "$dir/kill" >"$dir/kill.log" 2>&1 &
launcher=$!
for _ in $(seq 2400); do grep -q "background save started" "$dir/kill.log" && break; sleep 0.05; done
grep -q "background save started" "$dir/kill.log" || { cat "$dir/kill.log"; echo "FAIL: the background save did not start"; exit 1; }
# Kill while the write is in progress: its temporary files are there.
writing=""
for _ in $(seq 1000); do
  compgen -G "$dir/kill/.ck.tmp-*" >/dev/null && { writing=yes; break; }
  compgen -G "$dir/kill/ck.tmp-*/.__*" >/dev/null && { writing=yes; break; }
  sleep 0.002
done
pkill -9 -f "$checks hang $strategy $dir/kill"
[ -n "$writing" ] || { echo "FAIL: no temporary file of the background write was seen before the kill"; exit 1; }
status=0
wait "$launcher" 2>/dev/null || status=$?
[ "$status" -eq 137 ] || { echo "FAIL: the job ended with $status, expected 137 (its workers were SIGKILLed)"; exit 1; }
echo "killed during the background write; left in the folder: $(ls -A "$dir/kill" | tr '\n' ' ')"
stray="$(find "$dir/kill" -name .metadata ! -path "$dir/kill/ck/.metadata")"
[ -z "$stray" ] || { echo "FAIL: a half-written folder looks complete: $stray"; exit 1; }
job check "$strategy" "$dir/kill"

# An unwritable target. As root, a read-only bind mount and a 1 MiB tmpfs in a mount namespace of
# the job's own; otherwise a folder without write permission.
mkdir "$dir/read-only" "$dir/full"
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  unshare -m --propagation private bash -c "mount --bind '$dir/read-only' '$dir/read-only' &&
    mount -o remount,bind,ro '$dir/read-only' &&
    '$run' model --accelerator cpu --devices 2 '$checks' refused '$strategy' '$dir/read-only' 'Read-only file system' any"
  unshare -m --propagation private bash -c "mount -t tmpfs -o size=1m tmpfs '$dir/full' &&
    '$run' model --accelerator cpu --devices 2 '$checks' refused '$strategy' '$dir/full' 'No space left on device' later"
else
  [ "${CI:-}" != true ] || { echo "FAIL: under CI=true the full-disk case needs root and mount namespaces"; exit 1; }
  chmod a-w "$dir/read-only"
  job refused "$strategy" "$dir/read-only" "Permission denied" any
  echo "note: not root, so the full-disk case (a tmpfs mount) was not run"
fi
echo "background saves hold under $strategy"
