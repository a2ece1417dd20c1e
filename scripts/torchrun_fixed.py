#!/usr/bin/python3
"""torchrun for benchmarks: Debian's torch 1.13 torchrun crashes at start under Python 3.11
(Std.from_str looks enum members up by iteration, which 3.11 no longer yields for 0); this
wrapper parses the --redirects/--tee values itself, then runs torch.distributed.run.main."""
import re
import sys

import torch.distributed.elastic.multiprocessing.api as api


def _from_str(value):
    if re.fullmatch(r"[0-3]", value):
        return api.Std(int(value))
    if re.fullmatch(r"(\d+:[0-3],)*\d+:[0-3]", value):
        return {int(k): api.Std(int(v)) for k, v in (pair.split(":") for pair in value.split(","))}
    raise ValueError(f"{value!r} is not a valid --redirects/--tee value")


api.Std.from_str = staticmethod(_from_str)

from torch.distributed.run import main  # noqa: E402  (after the patch)

if __name__ == "__main__":
    sys.exit(main())
