// Fashion-MNIST from Debian's dataset-fashion-mnist package (MNIST idx format, gzip-compressed),
// as a LibTorch dataset: images as float tensors [1, 28, 28] normalised to mean 0, std 1; labels
// as int64 scalars.
#pragma once

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <string>

namespace examples {

/// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

class FashionMnist : public torch::data::datasets::Dataset<FashionMnist> {
 public:
  enum class Split { Train, Test };
  /// Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. A missing directory or file
  /// throws std::runtime_error naming the path and the Debian package that provides it.
  FashionMnist(const std::string& dir, Split split);

  torch::data::Example<> get(size_t index) override;
  torch::optional<size_t> size() const override;
  const torch::Tensor& images() const { return images_; }
  const torch::Tensor& targets() const { return targets_; }

 private:
  torch::Tensor images_;
  torch::Tensor targets_;
};

}  // namespace examples
