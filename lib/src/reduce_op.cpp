#include "lightning/fabric/reduce_op.h"

#include <algorithm>
#include <cctype>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

ReduceOp parse_reduce_op(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "sum") return ReduceOp::Sum;
  if (lower == "mean" || lower == "avg") return ReduceOp::Mean;
  if (lower == "max") return ReduceOp::Max;
  if (lower == "min") return ReduceOp::Min;
  if (lower == "product" || lower == "prod") return ReduceOp::Product;
  throw ValueError("reduce_op=\"" + name + "\" is not supported. Choose one of: sum, mean (avg), max, min, product.");
}

}  // namespace lightning::fabric
