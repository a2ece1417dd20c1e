#!/usr/bin/env bash
# Images and hyperparameters written by TensorBoardLogger equal what PyTorch's
# torch.utils.tensorboard.SummaryWriter writes for the same inputs. The C++ side (a hidden Catch2
# case) logs float32, float64 [H, W], bfloat16 and uint8 (one channel, RGBA) images and
# hyperparameters of every type (bool, int, float, text, 1-D tensors) with two metrics, and saves
# each image's exact bytes; LF_PYTHON's torch writes the same with add_image and add_hparams. Both
# files are decoded and compared tag by tag:
#   images: step, height, width, colorspace and every other field; the PNGs decoded (Pillow) to
#           equal modes and pixels. The PNG bytes themselves are not compared (another zlib stream).
#   hparams: each record byte for byte after its wall time, with PyTorch's session-start map
#           entries put in key order (Python's protobuf writes them in hash-table order; ours are
#           in key order, as the C++ map).
#   metrics: step and value of each scalar.
# Usage: tensorboard_vs_pytorch.sh UNIT_TESTS
set -euo pipefail
tests="$1"
source "$(dirname "${BASH_SOURCE[0]}")/../missing.sh"
python="${LF_PYTHON:-python3}"
"$python" -c "import torch.utils.tensorboard, PIL" 2>/dev/null ||
  missing "$python has no torch, tensorboard or Pillow (scripts/install-deps.sh installs them into .venv)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
LF_TB_DIR="$dir" "$tests" "[tensorboard-pytorch]" >"$dir/log" || { cat "$dir/log"; echo "FAIL: the C++ writer failed"; exit 1; }
file="$(sed -n 's/^event_file //p' "$dir/log")"
[ -f "$file" ] || { cat "$dir/log"; echo "FAIL: no event file"; exit 1; }
"$python" - "$dir" "$dir/log" "$file" <<'PY'
import glob, io, os, sys, warnings
import numpy as np
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionStartInfo
from torch.utils.tensorboard import SummaryWriter

warnings.filterwarnings("ignore", message="invalid value encountered in cast")  # the NaN pixel
inputs, log, ours_file = sys.argv[1:4]
theirs_dir = os.path.join(inputs, "pytorch")
failures = []

# PyTorch writes the same images (the C++ side's bytes) and hyperparameters.
numpy_types = {"Float": np.float32, "Double": np.float64, "Byte": np.uint8, "BFloat16": np.uint16}
writer = SummaryWriter(log_dir=theirs_dir)
for line in open(log):
    parts = line.split()
    if parts[:1] != ["image"]:
        continue
    tag, step, dtype, name, shape = parts[1], int(parts[2]), parts[3], parts[4], [int(s) for s in parts[5:]]
    image = torch.from_numpy(np.fromfile(os.path.join(inputs, name), dtype=numpy_types[dtype]).reshape(shape))
    if dtype == "BFloat16":
        image = image.view(torch.bfloat16)
    writer.add_image(tag, image, step, dataformats="HW" if len(shape) == 2 else "CHW")
# As the C++ map: in key order.
hparams = dict(sorted({
    "flag_on": True, "flag_off": False, "int": 12, "float": 3e-4, "text": "adamw", "text_empty": "",
    "tensor_float32": torch.tensor([0.1, 0.7]), "tensor_int64": torch.tensor([7]),
    "tensor_bfloat16": torch.tensor([0.1]).to(torch.bfloat16),
}.items()))
writer.add_hparams(hparams, {"val/acc": 0.5, "val/loss": 0.25}, run_name="hparams")
writer.close()

def load(paths):
    """tag -> [(record, event, value)] in file order."""
    found = {}
    for path in paths:
        for record in RawEventFileLoader(path).Load():
            event = Event.FromString(record)
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((record, event, value))
    return found

def varint(value):
    out = b""
    while value >= 0x80:
        out += bytes([value & 0x7F | 0x80])
        value >>= 7
    return out + bytes([value])

def key_ordered(content):
    """HParamsPluginData bytes as protobuf writes them, the session-start map in key order."""
    data = HParamsPluginData.FromString(content)
    if not data.HasField("session_start_info"):
        return data.SerializeToString()
    start = data.session_start_info
    entries = b""
    for key in sorted(start.hparams, key=lambda k: k.encode()):
        one = SessionStartInfo()
        one.hparams[key].CopyFrom(start.hparams[key])
        entries += one.SerializeToString()
    rest = SessionStartInfo()
    rest.CopyFrom(start)
    rest.ClearField("hparams")  # field 1, before every other field
    start_bytes = entries + rest.SerializeToString()
    data.ClearField("session_start_info")  # field 3, after version = 1
    return data.SerializeToString() + b"\x1a" + varint(len(start_bytes)) + start_bytes

def canonical(message, clear_png):
    """Protobuf's bytes without the wall time (and the PNG bytes when clear_png), the hparams
    plugin's content with its map in key order."""
    copy = type(message)()
    copy.CopyFrom(message)
    values = copy.summary.value if isinstance(copy, Event) else [copy]
    if isinstance(copy, Event):
        copy.ClearField("wall_time")
    for value in values:
        if clear_png and value.HasField("image"):
            value.image.ClearField("encoded_image_string")
        data = value.metadata.plugin_data
        if data.plugin_name == "hparams":
            data.content = key_ordered(data.content)
    return copy.SerializeToString()

ours = load([ours_file])
theirs = load(sorted(glob.glob(os.path.join(theirs_dir, "**", "events.out.tfevents.*"), recursive=True)))
images = ["bfloat16/rgb", "float32/rgb", "float64/grey_hw", "uint8/grey", "uint8/rgba"]
hparam_tags = ["_hparams_/experiment", "_hparams_/session_end_info", "_hparams_/session_start_info"]
expected = sorted(images + hparam_tags + ["val/acc", "val/loss"])
if sorted(ours) != expected:
    failures.append("our tags %s, expected %s" % (sorted(ours), expected))
if sorted(theirs) != expected:
    failures.append("PyTorch's tags %s, expected %s" % (sorted(theirs), expected))

for tag in expected:
    a, b = ours.get(tag, []), theirs.get(tag, [])
    if len(a) != len(b) or not a:
        failures.append("%s: %d events here, %d from PyTorch" % (tag, len(a), len(b)))
        continue
    for (record, event, value), (_, their_event, their_value) in zip(a, b):
        if event.step != their_event.step:
            failures.append("%s: step %d, PyTorch's %d" % (tag, event.step, their_event.step))
        if record[:1] != b"\x09" or record[9:] != canonical(event, False):
            failures.append("%s: our record is not protobuf's serialization of what it holds" % tag)
        if tag in hparam_tags:
            ours_content = HParamsPluginData.FromString(value.metadata.plugin_data.content)
            their_content = HParamsPluginData.FromString(their_value.metadata.plugin_data.content)
            if ours_content != their_content:
                failures.append("%s: content here %s, PyTorch's %s" % (tag, ours_content, their_content))
            elif record[9:] != canonical(their_event, False):
                failures.append("%s: record differs from PyTorch's: %s here, %s" % (tag, record[9:].hex(),
                                                                                  canonical(their_event, False).hex()))
        elif tag in images:
            if canonical(event, True) != canonical(their_event, True):
                failures.append("%s: fields besides the PNG differ: here %s, PyTorch's %s"
                                % (tag, (value.image.height, value.image.width, value.image.colorspace),
                                   (their_value.image.height, their_value.image.width, their_value.image.colorspace)))
            mine = Image.open(io.BytesIO(value.image.encoded_image_string))
            their = Image.open(io.BytesIO(their_value.image.encoded_image_string))
            if mine.mode != their.mode or mine.size != their.size:
                failures.append("%s: PNG mode/size %s %s, PyTorch's %s %s" % (tag, mine.mode, mine.size, their.mode, their.size))
                continue
            p, q = np.array(mine), np.array(their)
            differ = np.argwhere(p != q)
            if len(differ):
                at = tuple(int(i) for i in differ[0])
                failures.append("%s: %d of %d pixel values differ, first at %s: %d here, %d from PyTorch"
                                % (tag, len(differ), p.size, at, p[at], q[at]))
        elif canonical(value, False) != canonical(their_value, False):
            failures.append("%s: value %s, PyTorch's %s" % (tag, value, their_value))

if failures:
    print("FAIL: " + "\nFAIL: ".join(failures))
    sys.exit(1)
print("images and hyperparameters equal PyTorch's SummaryWriter: %d tags" % len(expected))
PY
