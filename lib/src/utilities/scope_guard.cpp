#include "lightning/fabric/utilities/scope_guard.h"

#include <c10/core/DefaultDtype.h>
#include <c10/util/typeid.h>

namespace lightning::fabric {

ScopeGuard default_dtype_guard(c10::ScalarType dtype) {
  const caffe2::TypeMeta previous = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::fromScalarType(dtype));
  return ScopeGuard([previous] { c10::set_default_dtype(previous); });
}

}  // namespace lightning::fabric
