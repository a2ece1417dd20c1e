#!/usr/bin/env bash
# Draws the loss and accuracy curves of a CSV log (CSVLogger's metrics.csv) into a PNG with gnuplot.
# Columns named *loss* go to the upper panel, *acc* to the lower one, against "step".
#   scripts/plot_metrics.sh logs/csv/version_0/metrics.csv metrics.png
set -euo pipefail
csv="${1:?usage: plot_metrics.sh METRICS_CSV OUTPUT_PNG}"
png="${2:?usage: plot_metrics.sh METRICS_CSV OUTPUT_PNG}"
command -v gnuplot >/dev/null || { echo "plot_metrics: gnuplot is missing: apt-get install gnuplot-nox" >&2; exit 2; }
[ -f "$csv" ] || { echo "plot_metrics: $csv does not exist" >&2; exit 2; }
header="$(head -n 1 "$csv")"
[[ "$header" == step,* ]] || { echo "plot_metrics: $csv has no leading 'step' column (header: $header)" >&2; exit 2; }
plots() {  # plots PATTERN: gnuplot plot clauses for the columns whose name matches
  local clauses=() index=0
  IFS=',' read -ra columns <<<"$header"
  for name in "${columns[@]}"; do
    index=$((index + 1))
    [[ "$name" == *$1* ]] && clauses+=("'$csv' using 1:$index with linespoints pointsize 0.4 title '$name'")
  done
  local IFS=','
  echo "${clauses[*]}"
}
losses="$(plots loss)"
accuracies="$(plots acc)"
[ -n "$losses$accuracies" ] || { echo "plot_metrics: no loss or accuracy columns in $csv" >&2; exit 2; }
panels=$(( (${#losses} > 0) + (${#accuracies} > 0) ))
{
  echo "set terminal pngcairo size 900,$((320 * panels)) font ',10'"
  echo "set output '$png'"
  echo "set datafile separator ','"
  echo "set datafile missing ''"
  echo "set termoption noenhanced"  # metric names keep their underscores
  echo "set key autotitle columnhead"
  echo "set grid"
  echo "set multiplot layout $panels,1"
  if [ -n "$losses" ]; then echo "set title 'loss'; set xlabel 'step'"; echo "plot $losses"; fi
  if [ -n "$accuracies" ]; then echo "set title 'accuracy'; set xlabel 'step'"; echo "plot $accuracies"; fi
  echo "unset multiplot"
} | gnuplot
echo "plot_metrics: wrote $png"
