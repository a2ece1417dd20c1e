#include "fashion_mnist.h"

#include <torch/types.h>
#include <zlib.h>

#include <filesystem>
#include <stdexcept>
#include <vector>

namespace examples {
namespace {

std::string missing_message(const std::string& what) {
  return what + ". Install Debian's dataset-fashion-mnist package (scripts/install-deps.sh does) or point "
                "--data-dir at a folder holding the Fashion-MNIST idx files.";
}

// Reads a whole file, gzip-compressed or not (zlib reads plain files transparently).
std::vector<uint8_t> read_file(const std::string& dir, const std::string& stem) {
  std::string path = dir + "/" + stem;
  if (!std::filesystem::exists(path)) path += ".gz";
  if (!std::filesystem::exists(path)) throw std::runtime_error(missing_message("Fashion-MNIST file " + dir + "/" + stem + "[.gz] not found"));
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error("cannot open " + path);
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  int read = 0;
  while ((read = gzread(file, chunk, sizeof(chunk))) > 0) bytes.insert(bytes.end(), chunk, chunk + read);
  gzclose(file);
  if (read < 0) throw std::runtime_error("corrupt gzip data in " + path);
  return bytes;
}

uint32_t big_endian(const std::vector<uint8_t>& bytes, size_t offset) {
  return (uint32_t{bytes[offset]} << 24) | (uint32_t{bytes[offset + 1]} << 16) | (uint32_t{bytes[offset + 2]} << 8) |
         uint32_t{bytes[offset + 3]};
}

torch::Tensor read_images(const std::string& dir, const std::string& stem) {
  auto bytes = read_file(dir, stem);
  if (bytes.size() < 16 || big_endian(bytes, 0) != 2051) throw std::runtime_error(stem + " is not an idx3 image file");
  const int64_t count = big_endian(bytes, 4), rows = big_endian(bytes, 8), cols = big_endian(bytes, 12);
  if (bytes.size() != static_cast<size_t>(16 + count * rows * cols)) throw std::runtime_error(stem + " is truncated");
  auto images = torch::from_blob(bytes.data() + 16, {count, 1, rows, cols}, torch::kUInt8).to(torch::kFloat32);
  // Fashion-MNIST pixel statistics (mean 0.2860, std 0.3530 on [0, 1]).
  return images.div_(255.0).sub_(kPixelMean).div_(kPixelStd);
}

torch::Tensor read_labels(const std::string& dir, const std::string& stem) {
  auto bytes = read_file(dir, stem);
  if (bytes.size() < 8 || big_endian(bytes, 0) != 2049) throw std::runtime_error(stem + " is not an idx1 label file");
  const int64_t count = big_endian(bytes, 4);
  if (bytes.size() != static_cast<size_t>(8 + count)) throw std::runtime_error(stem + " is truncated");
  return torch::from_blob(bytes.data() + 8, {count}, torch::kUInt8).to(torch::kInt64);
}

}  // namespace

FashionMnist::FashionMnist(const std::string& dir, Split split) {
  if (!std::filesystem::is_directory(dir)) throw std::runtime_error(missing_message("Fashion-MNIST folder " + dir + " does not exist"));
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  images_ = read_images(dir, prefix + "-images-idx3-ubyte");
  targets_ = read_labels(dir, prefix + "-labels-idx1-ubyte");
  if (images_.size(0) != targets_.size(0)) throw std::runtime_error("Fashion-MNIST images and labels disagree in count in " + dir);
}

torch::data::Example<> FashionMnist::get(size_t index) {
  return {images_[static_cast<int64_t>(index)], targets_[static_cast<int64_t>(index)]};
}

torch::optional<size_t> FashionMnist::size() const { return static_cast<size_t>(images_.size(0)); }

}  // namespace examples
