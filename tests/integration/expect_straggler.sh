# Sourced by the straggler tests, which define fail(): expect_straggler OUTPUT WHO.
#   OUTPUT: the job's whole output; WHO: the expected start of the line, e.g.
#   "lightning-run: rank 2 on $(hostname)". Checks the line names WHO with the default threshold,
#   a median lag that fits a 120 ms sleep, and appears once; prints the line.
expect_straggler() {
  local out="$1" who="$2" line lag
  line="$(grep "arrives last" <<<"$out")" || fail "the slow rank was not named: $out"
  grep -qF "$who arrives last at " <<<"$line" || fail "expected \"$who\": $line"
  grep -qF "(straggler threshold 0.05 s)" <<<"$line" || fail "not the default threshold: $line"
  lag="$(sed -n 's/.*median \([0-9]*\) ms behind.*/\1/p' <<<"$line")"
  [ -n "$lag" ] && [ "$lag" -ge 80 ] && [ "$lag" -le 400 ] || fail "median lag $lag ms for a 120 ms sleep: $line"
  [ "$(grep -c "arrives last" <<<"$out")" -eq 1 ] || fail "named more than once: $out"
  echo "named: $line"
}
