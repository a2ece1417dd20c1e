#!/usr/bin/env bash
# A model whose full parameters do not fit what a rank may still allocate trains under FULL_SHARD
# on 4 ranks when built on the meta device, and cannot even be built normally. The limit is a data
# limit (prlimit --data, which counts every private writable mapping) of each rank's own at rest
# (measured by a first run without limit) plus 0.85 x the full parameters. Extra flags go to the
# driver (--tensor-parallel 2: model_parallel, fsdp over tensor-parallel slices, mesh (2, 2);
# --tensor-parallel 4 --data-parallel ddp: ddp x tensor, mesh (1, 4)).
#   fsdp_meta_init_memory_limit.sh LIGHTNING_RUN BENCH_FSDP_META_INIT [FLAGS...]
set -uo pipefail
run="$1"; bench="$2"; shift 2
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1
model=(--layers 96 --width 512 --steps 2 "$@")  # 25.2 M parameters, 101 MB
field() { sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p" <<<"$2"; }
probe="$("$run" model --accelerator cpu --devices 4 "$bench" --meta "${model[@]}" 2>&1)" || fail "run without a limit: $probe"
base="$(field base_data_mb "$probe")"; full="$(field full_parameter_mb "$probe")"; peak="$(field train_peak_mb "$probe")"
[ -n "$base" ] && [ -n "$full" ] || fail "no measurement in: $probe"
limit_mb="$(awk -v b="$base" -v f="$full" 'BEGIN { printf "%d", b + 0.85 * f }')"
echo "each rank: $base MB of data at rest, full parameters $full MB, limit $limit_mb MB; meta-built train peak $peak MB"
limited=(prlimit --data=$((limit_mb * 1000000)))
meta="$("${limited[@]}" "$run" model --accelerator cpu --devices 4 "$bench" --meta "${model[@]}" 2>&1)" ||
  fail "the meta-built model did not train under the limit: $meta"
grep -q '"meta":true' <<<"$meta" || fail "no result from the meta-built run: $meta"
if normal="$("${limited[@]}" "$run" model --accelerator cpu --devices 4 "$bench" "${model[@]}" 2>&1)"; then
  fail "the normally built model fit the limit, so the limit proves nothing: $normal"
fi
grep -q "can't allocate memory" <<<"$normal" || fail "the normal build failed, but not for memory: $normal"
echo "the meta-built model trains under the limit, the normal build runs out of memory: all checks passed"
