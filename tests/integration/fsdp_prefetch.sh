#!/usr/bin/env bash
# fsdp prefetching (FSDPOptions::forward_prefetch, backward_prefetch) on 2 ranks: with it, the
# next unit's all-gather has been issued when the middle unit computes (one collective more at
# that point, forward and backward; SHARD_GRAD_OP keeps its full parameters through the backward,
# so there is nothing to prefetch there), and the weights after 3 steps are bitwise those without.
#   fsdp_prefetch.sh LIGHTNING_RUN FSDP_CHECKS SHARDING BACKEND
set -uo pipefail
run="$1"; checks="$2"; sharding="$3"; backend="$4"
fail() { echo "FAIL: $*"; exit 1; }
declare -A forward backward weights
for which in off forward backward both; do
  out="$("$run" model --accelerator cpu --devices 2 --process-group-backend "$backend" "$checks" prefetch \
    "$sharding" "$which" 2>&1)" || fail "$which: $out"
  line="$(grep -o "prefetch $sharding $which: .*" <<<"$out")" || fail "$which: no result in $out"
  echo "$line"
  forward[$which]="$(sed -n 's/.*forward_ops=\([0-9]*\).*/\1/p' <<<"$line")"
  backward[$which]="$(sed -n 's/.*backward_ops=\([0-9]*\).*/\1/p' <<<"$line")"
  weights[$which]="$(sed -n 's/.*weights_hash=\([0-9a-f]*\).*/\1/p' <<<"$line")"
done
[ "${forward[forward]}" = $((forward[off] + 1)) ] || fail "forward prefetch: ${forward[forward]} collectives at the middle unit, ${forward[off]} without"
[ "${forward[backward]}" = "${forward[off]}" ] || fail "backward prefetch changed the forward: ${forward[backward]} vs ${forward[off]}"
expected=$((backward[off] + 1)); [ "$sharding" = SHARD_GRAD_OP ] && expected="${backward[off]}"
[ "${backward[backward]}" = "$expected" ] || fail "backward prefetch: ${backward[backward]} collectives at the middle unit's backward, ${backward[off]} without"
for which in forward backward both; do
  [ -n "${weights[$which]}" ] && [ "${weights[$which]}" = "${weights[off]}" ] ||
    fail "weights' bytes hash to ${weights[$which]} with $which prefetch, ${weights[off]} without"
done
echo "prefetching issues the next gather early and changes no weight: all checks passed"
