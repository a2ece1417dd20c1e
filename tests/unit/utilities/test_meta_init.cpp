// Meta-device initialisation (utilities/meta_init.h): a build under the guard holds no parameter
// memory, and its replay gives the values of a normal build under the same seed, bit for bit,
// one full value at a time; the generator afterwards; the errors.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include "counting_allocator.h"

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

namespace {
// Layers whose reset() draws (Linear, Embedding), constant fills (LayerNorm), a parameter made
// out of place from a draw, a view filled in place, and a buffer computed from a factory.
struct TinyImpl : torch::nn::Module {
  explicit TinyImpl(int64_t width = 32)
      : embedding(register_module("embedding", torch::nn::Embedding(torch::nn::EmbeddingOptions(50, width).padding_idx(0)))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        first(register_module("first", torch::nn::Linear(width, 4 * width))),
        second(register_module("second", torch::nn::Linear(4 * width, width))) {
    scale = register_parameter("scale", torch::randn({width}) * 0.02 + 1.0);
    torch::NoGradGuard no_grad;
    second->weight.narrow(0, 0, 2).zero_();
    mask = register_buffer("mask", torch::ones({8, 8}).tril());
  }
  torch::nn::Embedding embedding;
  torch::nn::LayerNorm norm;
  torch::nn::Linear first, second;
  torch::Tensor scale, mask;
};
TORCH_MODULE(Tiny);

std::map<std::string, torch::Tensor> values(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().detach();
  for (const auto& item : module.named_buffers()) out[item.key()] = item.value();
  return out;
}

void require_equal(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto left = values(a), right = values(b);
  REQUIRE(left.size() == right.size());
  for (const auto& [name, tensor] : left) {
    INFO(name);
    REQUIRE(!right.at(name).is_meta());
    REQUIRE(torch::equal(tensor, right.at(name)));
  }
}
}  // namespace

TEST_CASE("meta init: the build holds no parameter memory, and materialising equals a normal build", "[meta_init]") {
  torch::manual_seed(7);
  Tiny normal;
  const auto draw_after_normal = torch::rand({4});

  torch::manual_seed(7);
  Tiny built = nullptr;
  CountingAllocator counting;
  const int64_t before = CountingAllocator::live();
  {
    auto guard = lf::meta_init_guard();
    built = Tiny();
  }
  CHECK(CountingAllocator::live() - before < 16 * 1024);  // shapes only (and the generator state, 5 kB)
  CHECK(lf::has_meta_tensors(*built));
  for (const auto& parameter : built->parameters()) CHECK(parameter.is_meta());
  CHECK(built->first->weight.requires_grad());

  lf::materialize_module(*built);
  CHECK_FALSE(lf::has_meta_tensors(*built));
  require_equal(*normal, *built);
  // The members and the module's own list hold the same tensors, which train as parameters.
  CHECK(built->first->weight.unsafeGetTensorImpl() == built->named_parameters()["first.weight"].unsafeGetTensorImpl());
  CHECK(built->first->weight.requires_grad());
  built->second(built->first(torch::randn({2, 32}))).sum().backward();
  CHECK(built->first->weight.grad().defined());
  // Nothing drew from the generator since the guard: it continues as after a normal build.
  torch::manual_seed(7);
  Tiny again = nullptr;
  {
    auto guard = lf::meta_init_guard();
    again = Tiny();
  }
  lf::materialize_module(*again);
  CHECK(torch::equal(torch::rand({4}), draw_after_normal));
}

TEST_CASE("meta init: draws between the build and the replay keep their stream", "[meta_init]") {
  torch::manual_seed(3);
  Tiny normal;
  torch::manual_seed(3);
  Tiny built = nullptr;
  {
    auto guard = lf::meta_init_guard();
    built = Tiny();
  }
  const auto data = torch::rand({4});  // e.g. the first batch
  const auto next = torch::rand({4});
  torch::manual_seed(3);
  Tiny unused = nullptr;
  {
    auto guard = lf::meta_init_guard();
    unused = Tiny();
  }
  const auto data_again = torch::rand({4});
  lf::materialize_module(*built);
  CHECK(torch::equal(data_again, data));
  CHECK(torch::equal(torch::rand({4}), next));  // the replay did not move the user's stream
  require_equal(*normal, *built);
}

TEST_CASE("meta init: one full value at a time, and install decides what stays", "[meta_init]") {
  torch::manual_seed(0);
  torch::nn::Sequential net = nullptr;
  {
    auto guard = lf::meta_init_guard();
    net = torch::nn::Sequential();
    for (int i = 0; i < 8; ++i) net->push_back(torch::nn::Linear(256, 256));
  }
  CountingAllocator counting;
  CountingAllocator::reset_peak();
  const int64_t before = CountingAllocator::live();
  std::vector<torch::Tensor> halves;
  std::vector<std::string> names;
  lf::MaterializeOptions options;
  options.install = [&](const std::string& name, bool is_parameter, const torch::Tensor& full) {
    CHECK(is_parameter);
    names.push_back(name);
    halves.push_back(full.reshape(-1).narrow(0, 0, full.numel() / 2).clone());
    return torch::empty({0}, full.options());
  };
  lf::materialize_module(*net, options);
  const double weight = 256 * 256 * 4.0;
  INFO("peak " << (CountingAllocator::peak() - before) / 1e6 << " MB above the start");
  CHECK(CountingAllocator::peak() - before < 0.5 * 8 * weight + 2 * weight);  // the halves plus one full weight
  CHECK(names.front() == "0.weight");
  CHECK(names.size() == 16);
  CHECK(net[0]->as<torch::nn::Linear>()->weight.numel() == 0);
  torch::manual_seed(0);
  torch::nn::Linear reference(256, 256);
  CHECK(torch::equal(halves.front(), reference->weight.reshape(-1).narrow(0, 0, 256 * 128)));
}

TEST_CASE("meta init: a nested guard adds to the outer record, and a default dtype is replayed", "[meta_init]") {
  torch::manual_seed(1);
  torch::nn::Sequential normal;
  {
    auto dtype = lf::default_dtype_guard(torch::kFloat64);
    normal->push_back(torch::nn::Linear(4, 4));
  }
  normal->push_back(torch::nn::Linear(4, 4));
  torch::manual_seed(1);
  torch::nn::Sequential built = nullptr;
  {
    auto outer = lf::meta_init_guard();
    built = torch::nn::Sequential();
    {
      auto dtype = lf::default_dtype_guard(torch::kFloat64);
      auto inner = lf::meta_init_guard();
      built->push_back(torch::nn::Linear(4, 4));
    }
    built->push_back(torch::nn::Linear(4, 4));
  }
  lf::materialize_module(*built);
  CHECK(built[0]->as<torch::nn::Linear>()->weight.scalar_type() == torch::kFloat64);
  require_equal(*normal, *built);
}

TEST_CASE("meta init: tensors that cannot be materialised are named", "[meta_init]") {
  struct ByHand : torch::nn::Module {
    ByHand() { register_parameter("weight", torch::empty({4, 4}, torch::kMeta)); }
  };
  ByHand by_hand;
  CHECK_THROWS_AS(lf::materialize_module(by_hand), lf::ValueError);
  CHECK_THROWS_WITH(lf::materialize_module(by_hand), Contains("'weight'") && Contains("no record of its build is left"));

  torch::nn::Linear first = nullptr, second = nullptr;
  {
    auto guard = lf::meta_init_guard();
    first = torch::nn::Linear(4, 4);
    second = torch::nn::Linear(4, 4);
  }
  lf::materialize_module(*first);
  CHECK_THROWS_WITH(lf::materialize_module(*second), Contains("'weight'") && Contains("a guard of its own"));

  {
    auto guard = lf::meta_init_guard();
    CHECK_THROWS_WITH(torch::zeros({1}).item<float>(), Contains("meta"));  // values do not exist while building
  }
}

TEST_CASE("meta init: an in-place change of shape on a factory's tensor replays as it ran", "[meta_init]") {
  struct Transposed : torch::nn::Module {
    Transposed() {
      auto w = torch::empty({3, 5});
      w.t_();
      torch::nn::init::normal_(w);
      weight = register_parameter("weight", w);
    }
    torch::Tensor weight;
  };
  torch::manual_seed(2);
  Transposed normal;
  torch::manual_seed(2);
  std::shared_ptr<Transposed> built;
  {
    auto guard = lf::meta_init_guard();
    built = std::make_shared<Transposed>();
  }
  lf::materialize_module(*built);
  REQUIRE(built->weight.sizes() == normal.weight.sizes());
  CHECK(built->weight.strides() == normal.weight.strides());
  CHECK(torch::equal(built->weight, normal.weight));
}

TEST_CASE("meta init: draws the ranks may not share are refused where asked, and missing meta kernels named",
          "[meta_init]") {
  struct OwnGenerator : torch::nn::Module {
    OwnGenerator() { register_parameter("noise", torch::randn({4}, at::detail::createCPUGenerator(11))); }
  };
  std::shared_ptr<OwnGenerator> built, again;
  {
    auto guard = lf::meta_init_guard();
    built = std::make_shared<OwnGenerator>();
  }
  {
    auto guard = lf::meta_init_guard();
    again = std::make_shared<OwnGenerator>();
  }
  lf::MaterializeOptions strict;
  strict.require_shared_generator = true;
  CHECK_THROWS_WITH(lf::materialize_module(*built, strict), Contains("'noise'") && Contains("explicit generator"));
  lf::materialize_module(*again);  // one process: fine
  CHECK(torch::equal(again->named_parameters()["noise"], torch::randn({4}, at::detail::createCPUGenerator(11))));

  auto guard = lf::meta_init_guard();
  CHECK_THROWS_WITH(torch::zeros({4, 2}).index_select(0, torch::zeros({1}, torch::kLong)),
                    Contains("aten::index_select") && Contains("no meta-device kernel"));
}

TEST_CASE("meta init: Fabric builds on the meta device under fsdp only, and setup materialises", "[meta_init]") {
  torch::manual_seed(5);
  Tiny normal;
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").devices(1));
  fabric.seed_everything(5);
  Tiny built = nullptr;
  {
    auto guard = fabric.init_module(/*empty_init=*/true);
    built = Tiny();
  }
  CHECK_FALSE(lf::has_meta_tensors(*built));  // single device: allocated, random fills skipped
  fabric.seed_everything(5);
  Tiny meta = nullptr;
  {
    auto guard = lf::meta_init_guard();
    meta = Tiny();
  }
  auto model = fabric.setup(meta);  // any strategy materialises a meta-built module at setup
  CHECK_FALSE(lf::has_meta_tensors(*meta));
  require_equal(*normal, *meta);
}
