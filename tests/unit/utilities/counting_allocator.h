// A test allocator for CPU tensor memory, shared by the unit tests that measure what tensors hold.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <mutex>
#include <unordered_map>

// Bytes of live CPU tensor memory, counted by an allocator put in front of LibTorch's while one
// exists (a count of what tensors hold, independent of malloc and of sanitizers). Its memory is
// LibTorch's own, released through the base allocator's raw deleter.
class CountingAllocator final : public c10::Allocator {
 public:
  CountingAllocator() : base_(c10::GetCPUAllocator()) {
    base_deleter() = base_->raw_deleter();
    c10::SetCPUAllocator(this, kPriority);
  }
  ~CountingAllocator() override { c10::SetCPUAllocator(base_, kPriority); }
  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr inner = base_->allocate(bytes);
    void* data = inner.get();
    REQUIRE(inner.get_context() == data);  // LibTorch's CPU allocator: context is the pointer
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mutex());
      sizes()[data] = bytes;
    }
    const int64_t now = live() += static_cast<int64_t>(bytes);
    for (int64_t seen = peak(); now > seen && !peak().compare_exchange_weak(seen, now);) {
    }
    return {data, data, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  static std::atomic<int64_t>& live() {
    static std::atomic<int64_t> bytes{0};
    return bytes;
  }
  /// The most live() has been since the last reset_peak().
  static std::atomic<int64_t>& peak() {
    static std::atomic<int64_t> bytes{0};
    return bytes;
  }
  static void reset_peak() { peak() = live().load(); }

 private:
  static void release(void* data) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      const auto found = sizes().find(data);
      if (found != sizes().end()) {
        live() -= static_cast<int64_t>(found->second);
        sizes().erase(found);
      }
    }
    base_deleter()(data);
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::unordered_map<void*, size_t>& sizes() {
    static std::unordered_map<void*, size_t> map;
    return map;
  }
  static c10::DeleterFnPtr& base_deleter() {
    static c10::DeleterFnPtr deleter = nullptr;
    return deleter;
  }
  static constexpr uint8_t kPriority = 200;
  c10::Allocator* base_;
};
