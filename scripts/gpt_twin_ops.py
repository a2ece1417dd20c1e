"""The ATen operators one CPU forward of examples/gpt's Python twin (scripts/p8_python_fabric.py)
issues, with their counts, as "count name" lines sorted by name: the Python side of the twin check
(tests/integration/gpt_twin_ops.sh compares it with `gpt --list-forward-ops`; the list it printed
is checked in as tests/integration/gpt_twin_ops.txt).
    python3 scripts/gpt_twin_ops.py --layers 2 --d-model 64 --heads 4 --seq 16 --batch-size 2 --vocab 100"""
import argparse
import collections
import importlib.util
import os

import torch
from torch.profiler import ProfilerActivity, profile

spec = importlib.util.spec_from_file_location("p8", os.path.join(os.path.dirname(__file__), "p8_python_fabric.py"))
p8 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(p8)

parser = argparse.ArgumentParser()
for name, default in [("vocab", 8192), ("seq", 512), ("d-model", 768), ("heads", 12), ("layers", 12), ("batch-size", 16)]:
    parser.add_argument("--" + name, type=int, default=default)
args = parser.parse_args()
torch.manual_seed(0)
model = p8.Gpt(args)
ids = torch.randint(args.vocab, (args.batch_size, args.seq))
with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
    model(ids)
counts = collections.Counter(event.name for event in prof.events() if event.name.startswith("aten::"))
for name in sorted(counts):
    print(counts[name], name)
