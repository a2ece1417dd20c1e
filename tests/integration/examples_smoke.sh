#!/usr/bin/env bash
# A few steps of the DCGAN, autoencoder and layer-wise-lr examples; the DCGAN grid is a valid
# 242 x 242 PNG; scripts/plot_metrics.sh draws a valid PNG from a CSV log.
# Usage: examples_smoke.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin="$1"; source="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$bin/dcgan" --max-steps 3 --batch-size 16 --accelerator cpu --output-dir "$dir/gan" --tensorboard "$dir/tb" | tee "$dir/gan.log"
grep -q "grid $dir/gan/epoch_1.png" "$dir/gan.log" || { echo "FAIL: dcgan did not report its grid"; exit 1; }
/usr/bin/python3 "$source/tests/integration/check_png.py" "$dir/gan/epoch_1.png" 242 242
# Its TensorBoard run, read by TensorBoard: the grid (the PNG file's pixels), the losses, histograms, hparams.
"${LF_PYTHON:-python3}" - "$dir/tb/dcgan/version_0" "$dir/gan/epoch_1.png" <<'PY' || { echo "FAIL: dcgan's TensorBoard run"; exit 1; }
import io, sys
import numpy as np
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
events = EventAccumulator(sys.argv[1], size_guidance={"images": 0, "histograms": 0})
events.Reload()
tags = events.Tags()
grid = events.Images("samples")[-1]
# The grey grid as TensorBoard stores it (PyTorch's way): RGB, times 255 truncated; the .png file
# rounds (as torchvision's save_image): each pixel is the file's or one less.
pixels = np.array(Image.open(io.BytesIO(grid.encoded_image_string))).astype(int)
rounded = np.array(Image.open(sys.argv[2])).astype(int)
assert (grid.width, grid.height) == (242, 242) and pixels.shape == rounded.shape + (3,), "grid size"
assert (pixels == pixels[..., :1]).all() and np.isin(rounded - pixels[..., 0], (0, 1)).all(), "grid pixels"
assert [s.step for s in events.Scalars("g_loss")] == [1, 2, 3], [s.step for s in events.Scalars("g_loss")]
assert any(t.startswith("generator/") for t in tags["histograms"]), tags["histograms"]
assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")
print("dcgan's TensorBoard run: grid, losses, histograms, hyperparameters")
PY
"$bin/autoencoder" --max-steps 30 --accelerator cpu | tee "$dir/ae.log"
grep -q "test_reconstruction_mse" "$dir/ae.log" || { echo "FAIL: autoencoder printed no error"; exit 1; }
"$bin/layerwise_lr" --max-steps 10 --accelerator cpu | tee "$dir/lr.log"
grep -q "body_lr 0.05 head_lr 0.001" "$dir/lr.log" || { echo "FAIL: layerwise_lr learning rates"; exit 1; }
printf 'step,train_loss,val_acc,val_loss\n1,2.3,,\n2,2.1,,\n3,1.9,0.5,1.8\n4,1.7,,\n5,1.5,0.6,1.4\n' >"$dir/metrics.csv"
bash "$source/scripts/plot_metrics.sh" "$dir/metrics.csv" "$dir/metrics.png"
/usr/bin/python3 "$source/tests/integration/check_png.py" "$dir/metrics.png"
# The GPT example and its Python twin (P8) build the same model: equal parameter counts.
tiny=(--accelerator cpu --layers 2 --d-model 64 --heads 4 --seq 32 --vocab 128 --batch-size 2 --steps 2 --warmup 1)
ours="$("$bin/gpt" "${tiny[@]}" --precision 32-true)"
echo "$ours"
source "$source/tests/missing.sh"
"${LF_PYTHON:-python3}" -c "import torch" 2>/dev/null || missing "${LF_PYTHON:-python3} has no torch for the GPT size comparison"
theirs="$("${LF_PYTHON:-python3}" "$source/scripts/p8_python_fabric.py" --plain "${tiny[@]}")"
echo "$theirs"
count() { sed -n 's/.*"parameters": *\([0-9]*\).*/\1/p' <<<"$1"; }
[ -n "$(count "$ours")" ] || { echo "FAIL: the C++ GPT printed no parameter count"; exit 1; }
[ "$(count "$ours")" = "$(count "$theirs")" ] || { echo "FAIL: the C++ and Python GPT differ in size"; exit 1; }
