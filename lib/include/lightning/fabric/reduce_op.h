// How an all-reduce combines the ranks' values; shared by Fabric::all_reduce, the strategies and
// the process groups.
#pragma once

#include "lightning/fabric/export.h"

#include <string>

namespace lightning::fabric {

enum class ReduceOp { Sum, Mean, Max, Min, Product };

/// Python's spellings: "sum", "mean" (alias "avg"), "max", "min", "product" (alias "prod"), any
/// case. ValueError listing them for anything else.
LF_API ReduceOp parse_reduce_op(const std::string& name);

}  // namespace lightning::fabric
