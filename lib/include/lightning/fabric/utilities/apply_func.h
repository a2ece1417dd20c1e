// Applies a function to every tensor inside a nested value: tensors, std::vector, std::pair,
// std::tuple, std::map, std::unordered_map, std::optional and torch::data::Example, nested to any
// depth. Everything else passes through unchanged. Fabric uses it to move batches and forward
// inputs to the device and to cast them per precision.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/data/example.h>

#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lightning::fabric {

template <class T, class Enable = void>
struct TensorApply {
  /// Not a tensor container: returned as is.
  template <class F>
  static T apply(T value, F&) { return value; }
};

/// apply_to_tensors(value, fn): a copy of value with fn(tensor) in place of every tensor.
template <class T, class F>
std::decay_t<T> apply_to_tensors(T&& value, F&& fn) {
  return TensorApply<std::decay_t<T>>::apply(std::forward<T>(value), fn);
}

template <>
struct TensorApply<at::Tensor> {
  template <class F>
  static at::Tensor apply(at::Tensor value, F& fn) { return fn(value); }
};

template <class T, class A>
struct TensorApply<std::vector<T, A>> {
  template <class F>
  static std::vector<T, A> apply(std::vector<T, A> value, F& fn) {
    for (auto& item : value) item = TensorApply<T>::apply(std::move(item), fn);
    return value;
  }
};

template <class K, class V, class... Rest>
struct TensorApply<std::map<K, V, Rest...>> {
  template <class F>
  static std::map<K, V, Rest...> apply(std::map<K, V, Rest...> value, F& fn) {
    for (auto& [key, item] : value) item = TensorApply<V>::apply(std::move(item), fn);
    return value;
  }
};

template <class K, class V, class... Rest>
struct TensorApply<std::unordered_map<K, V, Rest...>> {
  template <class F>
  static std::unordered_map<K, V, Rest...> apply(std::unordered_map<K, V, Rest...> value, F& fn) {
    for (auto& [key, item] : value) item = TensorApply<V>::apply(std::move(item), fn);
    return value;
  }
};

template <class A, class B>
struct TensorApply<std::pair<A, B>> {
  template <class F>
  static std::pair<A, B> apply(std::pair<A, B> value, F& fn) {
    return {TensorApply<A>::apply(std::move(value.first), fn), TensorApply<B>::apply(std::move(value.second), fn)};
  }
};

template <class... Ts>
struct TensorApply<std::tuple<Ts...>> {
  template <class F>
  static std::tuple<Ts...> apply(std::tuple<Ts...> value, F& fn) {
    return std::apply(
        [&fn](auto&&... items) {
          return std::tuple<Ts...>(TensorApply<std::decay_t<decltype(items)>>::apply(std::move(items), fn)...);
        },
        std::move(value));
  }
};

template <class T>
struct TensorApply<std::optional<T>> {
  template <class F>
  static std::optional<T> apply(std::optional<T> value, F& fn) {
    if (!value) return value;
    return TensorApply<T>::apply(std::move(*value), fn);
  }
};

template <class Data, class Target>
struct TensorApply<torch::data::Example<Data, Target>> {
  template <class F>
  static torch::data::Example<Data, Target> apply(torch::data::Example<Data, Target> value, F& fn) {
    return {TensorApply<Data>::apply(std::move(value.data), fn), TensorApply<Target>::apply(std::move(value.target), fn)};
  }
};

/// Moves every tensor in data to device (non-blocking copies where the source is pinned).
template <class T>
std::decay_t<T> move_data_to_device(T&& data, const c10::Device& device) {
  return apply_to_tensors(std::forward<T>(data), [&device](const at::Tensor& tensor) {
    return tensor.device() == device ? tensor : tensor.to(device, /*non_blocking=*/tensor.is_pinned());
  });
}

}  // namespace lightning::fabric
