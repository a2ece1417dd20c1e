#!/usr/bin/env bash
# Loaders resumed from a checkpoint written by another job (loader_checks.cpp, resume-save and
# resume-load): saved by SAVE_RANKS ranks, loaded by LOAD_RANKS. Another world size must warn that
# the resume is not exact. Every step's exit code counts.
# Usage: loader_resume.sh LAUNCHER CHECKS SAVE_RANKS LOAD_RANKS
set -euo pipefail
launcher="$1"; checks="$2"; save_ranks="$3"; load_ranks="$4"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$launcher" model --accelerator cpu --devices "$save_ranks" "$checks" resume-save "$dir/loaders.ckpt"
"$launcher" model --accelerator cpu --devices "$load_ranks" "$checks" resume-load "$dir/loaders.ckpt" 2>&1 | tee "$dir/log"
if [ "$save_ranks" != "$load_ranks" ]; then
  grep -q "the resume is not exact" "$dir/log" || { echo "FAIL: no warning that the resume is not exact"; exit 1; }
fi
echo "loaders resumed: saved by $save_ranks ranks, loaded by $load_ranks"
