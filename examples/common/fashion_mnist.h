// Fashion-MNIST from Debian's dataset-fashion-mnist package (MNIST idx format, gzip-compressed),
// as a LibTorch dataset: images as float tensors [1, 28, 28] normalised to mean 0, std 1; labels
// as int64 scalars.
#pragma once

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <string>

namespace examples {

/// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";
/// The pixel mean and standard deviation the images are normalised with.
inline constexpr double kPixelMean = 0.2860, kPixelStd = 0.3530;

/// Normalised images back to pixel intensities in [0, 1] (for generative examples).
inline torch::Tensor to_unit_range(const torch::Tensor& normalised) { return normalised * kPixelStd + kPixelMean; }

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
