// Streaming-read throughput: one epoch of lf::StreamingDataLoader over a dataset folder, batches
// collated as a training loop gets them; or (--write) a synthetic dataset to read. One JSON line:
//   bench_streaming read DIR|s3://... [--batch B] [--threads T] [--max-cache-bytes N] [--prefetch-chunks K]
//     {"reader": "cpp", "samples", "seconds", "samples_per_s", "wait_s", "cache_peak_bytes", "chunks_downloaded"}
//   bench_streaming write DIR tensor|jpeg ITEMS          (3 x 64 x 64 images, float32 or JPEG, and an int label)
#include "lightning/fabric/data/streaming_dataset.h"
#include "lightning/fabric/data/streaming_loader.h"
#include "lightning/fabric/data/streaming_writer.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>
#include <string>

namespace lf = lightning::fabric;

int main(int argc, char** argv) {
  const std::string command = argc > 2 ? argv[1] : "";
  if (command == "write" && argc == 5) {
    const std::string kind = argv[3];
    const int64_t items = std::stoll(argv[4]);
    lf::StreamingWriter writer(argv[2], lf::StreamingWriterOptions().chunk_bytes(64 << 20).formats({kind == "jpeg" ? "jpeg" : "tensor", "int"}));
    at::manual_seed(0);
    // Smooth images (a gradient plus low-frequency noise), so that JPEG sizes are realistic.
    const auto base = at::linspace(0, 1, 64).view({1, 1, 64}) * at::linspace(0, 1, 64).view({1, 64, 1});
    for (int64_t i = 0; i < items; ++i) {
      auto noise = at::upsample_bilinear2d(at::rand({1, 3, 8, 8}), {64, 64}, false)[0];
      auto image = (base * 0.5 + noise * 0.5).clamp(0, 1);
      c10::IValue pixels = kind == "jpeg" ? image.mul(255).round().to(at::kByte) : image.to(at::kFloat);
      writer.add(c10::ivalue::Tuple::create({pixels, i % 1000}));
    }
    writer.finish();
    return 0;
  }
  if (command == "read") {
    int64_t batch = 256;
    int threads = 2, prefetch_chunks = 2;
    lf::StreamingDatasetOptions cache;
    for (int i = 3; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      if (flag == "--batch") batch = std::stoll(argv[i + 1]);
      else if (flag == "--threads") threads = std::stoi(argv[i + 1]);
      else if (flag == "--max-cache-bytes") cache.max_cache_bytes(std::stoll(argv[i + 1]));
      else if (flag == "--prefetch-chunks") prefetch_chunks = std::stoi(argv[i + 1]);
    }
    lf::StreamingDataset dataset(argv[2], cache);
    lf::StreamingDataLoader loader(
        dataset, lf::StreamingLoaderOptions().batch_size(batch).threads(threads).shuffle(true).prefetch_chunks(prefetch_chunks));
    const auto start = std::chrono::steady_clock::now();
    int64_t samples = 0;
    double checksum = 0;
    for (auto& b : loader) {
      const auto& fields = b.data.toTupleRef().elements();
      samples += fields[0].toTensor().size(0);
      checksum += fields[1].toTensor().sum().item<double>();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << nlohmann::json{{"reader", "cpp"}, {"threads", threads}, {"batch", batch}, {"samples", samples},
                                {"seconds", seconds}, {"samples_per_s", samples / seconds},
                                {"wait_s", loader.wait_seconds()}, {"label_sum", checksum},
                                {"cache_peak_bytes", dataset.cache_peak_bytes()},
                                {"chunks_downloaded", dataset.chunks_downloaded()}}.dump()
              << std::endl;
    return 0;
  }
  std::cerr << "usage: bench_streaming read DIR|s3://... [--batch B] [--threads T] [--max-cache-bytes N] "
               "[--prefetch-chunks K] | write DIR tensor|jpeg ITEMS\n";
  return 2;
}
