#!/usr/bin/env bash
# Images, histograms, text and hyperparameters written by TensorBoardLogger, read back by
# TensorBoard's own readers only (the tensorboard package of LF_PYTHON): EventAccumulator for the
# images (decoded by Pillow), histograms and text, and the HParams plugin's metadata parser for the
# experiment and session summaries. Usage: tensorboard_rich.sh UNIT_TESTS
set -euo pipefail
tests="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
LF_TB_DIR="$dir" "$tests" "[tensorboard-rich]" >"$dir/log"
file="$(sed -n 's/^event_file //p' "$dir/log")"
[ -f "$file" ] || { cat "$dir/log"; echo "FAIL: no event file"; exit 1; }
"${LF_PYTHON:-python3}" - "$file" <<'PY'
import io, sys
import numpy as np
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.util import tensor_util

events = EventAccumulator(sys.argv[1], size_guidance={"images": 0, "histograms": 0, "tensors": 0})
events.Reload()
tags = events.Tags()
failures = []
def check(ok, what):
    if not ok:
        failures.append(what)

# Images, as PyTorch's summary.image stores them: RGB channel c, row y, column x holds the float32
# (c * 8 + y * 4 + x) * 10 / 255, times 255 in float32 and truncated; grey (40 * index) as RGB.
check(sorted(tags["images"]) == ["samples/grey", "samples/rgb"], "image tags %s" % tags["images"])
rgb = events.Images("samples/rgb")[0]
check(rgb.step == 5 and (rgb.width, rgb.height) == (4, 2), "rgb step/size %s" % ((rgb.step, rgb.width, rgb.height),))
pixels = np.array(Image.open(io.BytesIO(rgb.encoded_image_string)))
unit = np.arange(24, dtype=np.float32).reshape(3, 2, 4) * np.float32(10) / np.float32(255)
expected = (unit * np.float32(255)).clip(0, 255).astype(np.uint8).transpose(1, 2, 0)
check(pixels.shape == (2, 4, 3) and (pixels == expected).all(), "rgb pixels %s" % pixels.tolist())
grey = events.Images("samples/grey")[0]
grey_pixels = np.array(Image.open(io.BytesIO(grey.encoded_image_string)))
grey_expected = np.repeat((np.arange(6).reshape(2, 3, 1) * 40).astype(np.uint8), 3, axis=2)
check(grey.step == 6 and grey_pixels.shape == (2, 3, 3) and (grey_pixels == grey_expected).all(),
      "grey pixels %s" % grey_pixels.tolist())

# Histogram of 0, 1, 1, 2, 4 (the NaN dropped) in 4 buckets over [0, 4].
histogram = events.Histograms("weights")[0]
value = histogram.histogram_value
check(histogram.step == 7, "histogram step %d" % histogram.step)
check((value.min, value.max, value.num, value.sum, value.sum_squares) == (0.0, 4.0, 5.0, 8.0, 22.0),
      "histogram moments %s" % ((value.min, value.max, value.num, value.sum, value.sum_squares),))
check(list(value.bucket_limit) == [1.0, 2.0, 3.0, 4.0] and list(value.bucket) == [1.0, 2.0, 1.0, 1.0],
      "histogram buckets %s %s" % (list(value.bucket_limit), list(value.bucket)))

# Text, as the text plugin stores it.
check(events.SummaryMetadata("notes").plugin_data.plugin_name == "text", "text plugin name")
text = events.Tensors("notes")[0]
check(text.step == 8 and tensor_util.make_ndarray(text.tensor_proto).tolist() == [b"**bold** and plain"],
      "text %s" % tensor_util.make_ndarray(text.tensor_proto))

# Hyperparameters: the HParams plugin's own parser, typed values (a flag as the number 1, as
# PyTorch writes a bool), the metric named.
content = events.PluginTagToContent("hparams")
experiment = hparams_metadata.parse_experiment_plugin_data(content["_hparams_/experiment"])
types = {info.name: info.type for info in experiment.hparam_infos}
check(types == {"lr": 3, "optimizer": 1, "nesterov": 3, "layers": 3}, "hparam types %s" % types)
check([m.name.tag for m in experiment.metric_infos] == ["val/loss"], "metric infos %s" % experiment.metric_infos)
start = hparams_metadata.parse_session_start_info_plugin_data(content["_hparams_/session_start_info"])
values = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
check(values == {"lr": 0.5, "optimizer": "adam", "nesterov": 1.0, "layers": 3.0}, "hparam values %s" % values)
check(start.hparams["nesterov"].WhichOneof("kind") == "number_value", "nesterov %s" % start.hparams["nesterov"])
end = hparams_metadata.parse_session_end_info_plugin_data(content["_hparams_/session_end_info"])
check(end.status == 1, "session end status %s" % end.status)
check([(s.step, s.value) for s in events.Scalars("val/loss")] == [(0, 0.25)], "the metric's scalar")

if failures:
    print("FAIL: " + "; ".join(failures))
    sys.exit(1)
print("TensorBoard reads the images, histogram, text and hyperparameters as written")
PY
