#include "lightning/fabric/checkpoint/background_write.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <system_error>
#include <unordered_map>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace {
thread_local HostBufferPool* copy_pool = nullptr;  // set by a HostCopyScope

class HostCopier {
 public:
  c10::IValue copy(const c10::IValue& value) {
    if (value.isTensor()) return tensor(value.toTensor());
    if (value.isGenericDict()) {
      const auto dict = value.toGenericDict();
      c10::impl::GenericDict out(dict.keyType(), dict.valueType());
      for (const auto& item : dict) out.insert(item.key(), copy(item.value()));
      return out;
    }
    if (value.isList()) {
      const auto list = value.toList();
      c10::impl::GenericList out(list.elementType());
      out.reserve(list.size());
      for (const c10::IValue item : list) out.push_back(copy(item));
      return out;
    }
    if (value.isTuple()) {
      std::vector<c10::IValue> items;
      for (const c10::IValue& item : value.toTupleRef().elements()) items.push_back(copy(item));
      return c10::ivalue::Tuple::create(std::move(items));
    }
    LF_CHECK(value.isNone() || value.isInt() || value.isDouble() || value.isBool() || value.isString() ||
                 value.isComplexDouble() || value.isDevice(),
             ValueError, "fabric.save_in_background: a value of type ", value.tagKind(),
             " in the state cannot be copied for the background write; save it with fabric.save, or store it as ",
             "a tensor, number, string, list or dict.");
    return value;  // numbers, strings, None: immutable
  }

 private:
  at::Tensor tensor(const at::Tensor& original) {
    if (!original.defined()) return original;
    // Layouts without one plain storage (sparse, mkldnn) and lazily conjugated or negated views
    // are copied as values.
    if (!original.has_storage() || original.layout() != at::kStrided || original.is_conj() || original.is_neg()) {
      return original.detach().resolve_conj().resolve_neg().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
    if (!original.device().is_cpu()) return device_copy(original);
    // The same tensor twice stays one tensor (the pickle refers back to it).
    auto same = tensors_.find(original.unsafeGetTensorImpl());
    if (same != tensors_.end()) return same->second;
    at::Tensor copy = view_of_copy(original);
    tensors_.emplace(original.unsafeGetTensorImpl(), copy);
    return copy;
  }

  // A device tensor as fabric.save's .cpu() copies it: its own elements into storage of its own,
  // strides kept when they are dense, here pinned (one DMA per tensor).
  at::Tensor device_copy(const at::Tensor& source) {
    const bool dense = source.is_non_overlapping_and_dense();
    const at::Tensor layout = dense ? source : source.contiguous();
    const int64_t bytes = layout.numel() * static_cast<int64_t>(layout.element_size());
    const at::Tensor buffer = take(bytes, /*pinned=*/true);
    at::Tensor copy = at::empty({0}, source.options().device(at::kCPU).requires_grad(false))
                          .set_(buffer.storage(), 0, layout.sizes(), layout.strides());
    copy.copy_(source);
    return copy;
  }

  static at::Tensor take(int64_t bytes, bool pinned) {
    return copy_pool ? copy_pool->take(bytes, pinned)
                     : at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(pinned));
  }

  at::Tensor view_of_copy(const at::Tensor& source) {
    const c10::Storage& storage = source.storage();
    auto found = copies_.find(storage.unsafeGetStorageImpl());
    if (found == copies_.end()) {
      const auto bytes = static_cast<int64_t>(storage.nbytes());
      const auto byte_options = at::TensorOptions().dtype(at::kByte).device(source.device());
      const at::Tensor original = at::empty({0}, byte_options).set_(storage, 0, {bytes}, {1});
      at::Tensor copied = take(bytes, /*pinned=*/false);
      copied.copy_(original);
      found = copies_.emplace(storage.unsafeGetStorageImpl(), copied).first;
    }
    return at::empty({0}, source.options().device(at::kCPU).requires_grad(false))
        .set_(found->second.storage(), source.storage_offset(), source.sizes(), source.strides());
  }

  std::unordered_map<const c10::StorageImpl*, at::Tensor> copies_;  // whole storages, as bytes
  std::unordered_map<const c10::TensorImpl*, at::Tensor> tensors_;
};
}  // namespace

at::Tensor HostBufferPool::take(int64_t bytes, bool pinned) {
  at::Tensor buffer;
  auto found = free_.find({bytes, pinned});
  if (found != free_.end()) {
    buffer = found->second;
    free_.erase(found);
  } else {
    buffer = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(pinned));
  }
  taken_.emplace(std::make_pair(bytes, pinned), buffer);
  return buffer;
}

void HostBufferPool::start_copy() {
  free_.merge(taken_);
  taken_.clear();
}

void HostBufferPool::finish_copy() { free_.clear(); }

HostCopyScope::HostCopyScope(HostBufferPool& pool) : previous_(copy_pool) { copy_pool = &pool; }
HostCopyScope::~HostCopyScope() { copy_pool = previous_; }

at::Tensor saved_tensor(const at::Tensor& tensor) { return copy_pool ? tensor.detach() : tensor.detach().cpu(); }

c10::IValue host_copy(const c10::IValue& value) {
  at::NoGradGuard no_grad;
  return HostCopier().copy(value);
}

BackgroundWrite::BackgroundWrite(std::string call, std::function<void()> write) : call_(std::move(call)) {
  auto run = [this, write = std::move(write)] {
    try {
      at::NoGradGuard no_grad;
      write();
    } catch (...) {
      error_ = std::current_exception();
    }
    finished_.store(true, std::memory_order_release);
  };
  try {
    thread_ = std::thread(run);
  } catch (const std::system_error&) {
    run();  // no thread to be had: write here, so every rank still has this save to settle
  }
}

BackgroundWrite::~BackgroundWrite() {
  if (thread_.joinable()) thread_.join();
}

std::exception_ptr BackgroundWrite::wait() {
  if (thread_.joinable()) thread_.join();
  return error_;
}

}  // namespace lightning::fabric
