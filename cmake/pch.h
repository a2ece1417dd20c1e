// The LibTorch headers almost every translation unit of this project includes, precompiled once.
#pragma once
#include <torch/torch.h>
