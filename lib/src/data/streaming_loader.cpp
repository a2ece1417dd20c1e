#include "lightning/fabric/data/streaming_loader.h"

#include "lightning/fabric/data/litdata_order.h"
#include "lightning/fabric/errors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

namespace lightning::fabric {

// --- collate ---------------------------------------------------------------------------------

namespace {

c10::IValue collate_at(const std::vector<c10::IValue>& items, const std::string& path) {
  const c10::IValue& first = items.front();
  auto same = [&](auto&& predicate, const char* what) {
    for (size_t i = 1; i < items.size(); ++i)
      LF_CHECK(predicate(items[i]), ValueError, "collate_items: item ", i, " has ", items[i].tagKind(), " at ",
               path.empty() ? "the top" : path, " where item 0 has ", what);
  };
  if (first.isTensor()) {
    same([](const c10::IValue& v) { return v.isTensor(); }, "a tensor");
    std::vector<at::Tensor> tensors;
    tensors.reserve(items.size());
    for (const auto& item : items) {
      tensors.push_back(item.toTensor());
      LF_CHECK(tensors.back().sizes() == tensors.front().sizes(), ValueError, "collate_items: item ", tensors.size() - 1,
               " has a tensor of shape ", tensors.back().sizes(), " at ", path.empty() ? "the top" : path,
               " where item 0 has ", tensors.front().sizes(),
               "; stack needs equal shapes (resize the samples, or set collate(false) and batch them yourself)");
    }
    return at::stack(tensors);
  }
  if (first.isBool() || first.isInt() || first.isDouble()) {
    const bool is_bool = first.isBool(), is_int = first.isInt();
    same([&](const c10::IValue& v) { return is_bool ? v.isBool() : is_int ? v.isInt() : v.isDouble(); },
         is_bool ? "a bool" : is_int ? "an int" : "a double");
    at::Tensor out = at::empty({static_cast<int64_t>(items.size())}, is_bool ? at::kBool : is_int ? at::kLong : at::kDouble);
    for (size_t i = 0; i < items.size(); ++i) {
      if (is_bool) out.data_ptr<bool>()[i] = items[i].toBool();
      else if (is_int) out.data_ptr<int64_t>()[i] = items[i].toInt();
      else out.data_ptr<double>()[i] = items[i].toDouble();
    }
    return out;
  }
  if (first.isString() || first.isNone()) {
    if (first.isNone()) return c10::IValue();
    c10::impl::GenericList list(c10::AnyType::get());
    for (const auto& item : items) list.push_back(item);
    return list;
  }
  if (first.isTuple() || first.isList()) {
    const bool tuple = first.isTuple();
    auto elements = [&](const c10::IValue& v) {
      return tuple ? std::vector<c10::IValue>(v.toTupleRef().elements().begin(), v.toTupleRef().elements().end())
                   : v.toList().vec();
    };
    const size_t width = elements(first).size();
    same([&](const c10::IValue& v) { return (tuple ? v.isTuple() : v.isList()) && elements(v).size() == width; },
         tuple ? "a tuple of that length" : "a list of that length");
    std::vector<std::vector<c10::IValue>> columns(width);
    for (const auto& item : items) {
      auto values = elements(item);
      for (size_t k = 0; k < width; ++k) columns[k].push_back(std::move(values[k]));
    }
    std::vector<c10::IValue> collated;
    for (size_t k = 0; k < width; ++k) collated.push_back(collate_at(columns[k], path + "[" + std::to_string(k) + "]"));
    if (tuple) return c10::ivalue::Tuple::create(std::move(collated));
    c10::impl::GenericList list(c10::AnyType::get());
    for (auto& value : collated) list.push_back(std::move(value));
    return list;
  }
  if (first.isGenericDict()) {
    const auto keys = first.toGenericDict();
    same([&](const c10::IValue& v) { return v.isGenericDict() && v.toGenericDict().size() == keys.size(); },
         "a dict with those keys");
    c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
    for (const auto& entry : keys) {
      std::vector<c10::IValue> column;
      for (const auto& item : items) {
        const auto dict = item.toGenericDict();
        const auto found = dict.find(entry.key());
        LF_CHECK(found != dict.end(), ValueError, "collate_items: an item lacks the key ", entry.key().toStringRef(),
                 " at ", path.empty() ? "the top" : path);
        column.push_back(found->value());
      }
      out.insert(entry.key(), collate_at(column, path + "[\"" + entry.key().toStringRef() + "\"]"));
    }
    return out;
  }
  throw ValueError("collate_items: a leaf of type " + first.tagKind() + " cannot be collated");
}

int64_t tensor_bytes(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor().numel() * value.toTensor().element_size();
  int64_t total = 0;
  if (value.isTuple())
    for (const auto& element : value.toTupleRef().elements()) total += tensor_bytes(element);
  else if (value.isList())
    for (const auto& element : value.toListRef()) total += tensor_bytes(element);
  else if (value.isGenericDict())
    for (const auto& entry : value.toGenericDict()) total += tensor_bytes(entry.value());
  return total;
}

// value with each tensor leaf replaced by f(leaf), tuples, lists and dicts rebuilt around them.
template <class F>
c10::IValue map_tensors(const c10::IValue& value, const F& f) {
  if (value.isTensor()) return f(value.toTensor());
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const auto& element : value.toTupleRef().elements()) elements.push_back(map_tensors(element, f));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  if (value.isList()) {
    c10::impl::GenericList list(c10::AnyType::get());
    for (const auto& element : value.toListRef()) list.push_back(map_tensors(element, f));
    return list;
  }
  if (value.isGenericDict()) {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    for (const auto& entry : value.toGenericDict()) dict.insert(entry.key(), map_tensors(entry.value(), f));
    return dict;
  }
  return value;
}

c10::IValue pinned(const c10::IValue& value) {
  return map_tensors(value, [](const at::Tensor& tensor) { return tensor.pin_memory(); });
}

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (!value || !*value) return fallback;
  try {
    return std::stoi(value);
  } catch (const std::exception&) {
    throw ValueError(std::string("StreamingDataLoader: environment variable ") + name + "=" + value + " is not a number");
  }
}

}  // namespace

c10::IValue collate_items(const std::vector<c10::IValue>& items) {
  LF_CHECK(!items.empty(), ValueError, "collate_items: no items");
  return collate_at(items, "");
}

// --- the plan of a pass ----------------------------------------------------------------------

namespace data_detail {

/// One topology an epoch was read under: batches taken under it before the job moved on (elastic
/// restart) or, for the last stage, so far.
struct Stage {
  int64_t world_size = 1, num_workers = 1, batch_size = 1, taken = 0;
  bool same_topology(const Stage& other) const {
    return world_size == other.world_size && num_workers == other.num_workers && batch_size == other.batch_size;
  }
};

namespace {

using Batches = std::vector<std::vector<int64_t>>;

// Items striped over ranks in batches: batch b goes to rank b % world; with drop_last, or more
// than one rank (which must take equal batch counts, or a collective would wait forever), only
// whole rounds of world * batch_size items.
Batches stripe(const std::vector<int64_t>& items, const Stage& stage, bool drop_last, int64_t rank) {
  size_t n = items.size();
  const size_t round = static_cast<size_t>(stage.world_size * stage.batch_size);
  if (drop_last || stage.world_size > 1) n -= n % round;
  Batches batches;
  const size_t size = static_cast<size_t>(stage.batch_size);
  for (size_t b = 0; b * size < n; ++b)
    if (static_cast<int64_t>(b % stage.world_size) == rank)
      batches.emplace_back(items.begin() + b * size, items.begin() + std::min(n, (b + 1) * size));
  return batches;
}

// The items no rank had taken after `taken` batches each, interleaved by batch position.
std::vector<int64_t> untaken(const std::vector<Batches>& per_rank, int64_t taken) {
  std::vector<int64_t> items;
  for (size_t k = static_cast<size_t>(taken);; ++k) {
    bool any = false;
    for (const auto& batches : per_rank) {
      if (k < batches.size()) {
        items.insert(items.end(), batches[k].begin(), batches[k].end());
        any = true;
      }
    }
    if (!any) return items;
  }
}

// This rank's batches of `current`, after the earlier stages `history` of the same epoch: the
// first stage reads LitData's order; each later one stripes what the earlier left untaken.
Batches plan(const std::vector<int64_t>& chunk_sizes, OrderSpec spec, const std::vector<Stage>& history,
             const Stage& current, int64_t rank) {
  auto stage_spec = [&](const Stage& stage) {
    OrderSpec s = spec;
    s.world_size = static_cast<int>(stage.world_size);
    s.num_workers = static_cast<int>(std::max<int64_t>(1, stage.num_workers));
    s.batch_size = stage.batch_size;
    return s;
  };
  if (history.empty()) return rank_batches(chunk_sizes, stage_spec(current), static_cast<int>(rank));
  std::vector<int64_t> items;
  for (size_t j = 0; j < history.size(); ++j) {
    std::vector<Batches> per_rank;
    for (int64_t r = 0; r < history[j].world_size; ++r)
      per_rank.push_back(j == 0 ? rank_batches(chunk_sizes, stage_spec(history[j]), static_cast<int>(r))
                                : stripe(items, history[j], spec.drop_last, r));
    items = untaken(per_rank, history[j].taken);
  }
  return stripe(items, current, spec.drop_last, rank);
}

}  // namespace

struct Ready {
  std::shared_ptr<StreamingBatch> batch;
  std::exception_ptr error;
  int64_t bytes = 0;
};

struct LoaderPass {
  OrderSpec spec;  // world_size, num_workers, batch_size: this job's
  int64_t rank = 0;
  int64_t next_epoch = 1;
  std::optional<int64_t> chosen_epoch;  // set_epoch
  // A loaded state the next begin() continues (the epoch and its stages; finished: start the next).
  struct Saved {
    int64_t epoch = 1;
    std::vector<Stage> stages;
    bool finished = false;
    bool drop_last = false;  // the order of a resumed epoch was planned with it
  };
  std::optional<Saved> saved;

  bool started = false, finished = false;
  int64_t epoch = 1;
  bool drop_last = false;  // this pass's: the loader's own, or a resumed epoch's
  std::vector<Stage> history;
  Stage current;
  Batches batches;
  double wait = 0;

  std::vector<std::thread> threads;
  std::mutex mutex;
  std::condition_variable changed;
  int64_t claim = 0, consumed = 0, ready_bytes = 0;
  std::map<int64_t, Ready> ready;
  bool stop = false;
  // An s3:// dataset: the chunks whose last batch of the pass is the key (let go once it is read).
  std::map<int64_t, std::vector<size_t>> release_after;

  Stage own_stage() const {
    return {spec.world_size, std::max(1, spec.num_workers), spec.batch_size, 0};
  }

  void stop_reading() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    changed.notify_all();
    for (auto& thread : threads) thread.join();
    threads.clear();
    ready.clear();
    ready_bytes = 0;
    stop = false;
  }
};

}  // namespace data_detail

// --- the loader ------------------------------------------------------------------------------

StreamingDataLoader::StreamingDataLoader(const StreamingDataset& dataset, StreamingLoaderOptions options)
    : dataset_(dataset), options_(std::move(options)), pass_(std::make_unique<data_detail::LoaderPass>()) {
  const auto& o = options_;
  const std::string who = "StreamingDataLoader(" + dataset.dir().string() + ")";
  LF_CHECK(o.batch_size_ >= 1, ValueError, who, ": batch_size must be 1 or more, got ", o.batch_size_);
  LF_CHECK(o.seed_ >= 0 && o.seed_ <= 0xffffffffLL, ValueError, who, ": seed must be in [0, 2^32 - 1] as LitData's, got ",
           o.seed_);
  LF_CHECK(o.item_shuffle_window_ >= 0, ValueError, who, ": item_shuffle_window must be 0 (whole piece) or more, got ",
           o.item_shuffle_window_);
  LF_CHECK(o.num_workers_ >= 0, ValueError, who, ": num_workers must be 0 or more, got ", o.num_workers_);
  LF_CHECK(o.threads_ >= 1, ValueError, who, ": threads must be 1 or more, got ", o.threads_);
  LF_CHECK(o.prefetch_batches_ >= 1, ValueError, who, ": prefetch_batches must be 1 or more, got ", o.prefetch_batches_);
  LF_CHECK(o.prefetch_chunks_ >= 0, ValueError, who, ": prefetch_chunks must be 0 (no fetch ahead) or more, got ",
           o.prefetch_chunks_);
  LF_CHECK(o.max_prefetch_bytes_ >= 1, ValueError, who, ": max_prefetch_bytes must be positive, got ", o.max_prefetch_bytes_);
  const int world = o.world_size_ >= 0 ? o.world_size_ : env_int("WORLD_SIZE", 1);
  const int rank = o.rank_ >= 0 ? o.rank_ : env_int("RANK", 0);
  LF_CHECK(world >= 1 && rank >= 0 && rank < world, ValueError, who, ": rank ", rank, " of world size ", world,
           " is out of range; the rank is 0 to world_size - 1 (pass fabric.world_size() and fabric.global_rank())");
  LF_CHECK(dataset.size() > 0, ValueError, who, ": the dataset has no items");
  if (o.pin_memory_) {
    try {
      (void)at::empty({1}).pin_memory();
    } catch (const std::exception& e) {
      throw ValueError(who + ": pin_memory(true) needs a CUDA device (" + e.what() + "); leave it off on CPU");
    }
  }
  drop_last_ = o.drop_last_.value_or(world > 1);
  auto& spec = pass_->spec;
  spec.shuffle = o.shuffle_;
  spec.seed = static_cast<uint32_t>(o.seed_);
  spec.drop_last = drop_last_;
  spec.item_window = o.item_shuffle_window_;
  spec.world_size = world;
  spec.num_workers = std::max(1, o.num_workers_);
  spec.batch_size = o.batch_size_;
  pass_->rank = rank;
  handle_ = std::make_shared<StreamingDataLoader*>(this);
}

void StreamingDataLoader::place(int replicas, int rank, c10::Device device, const std::string& call) {
  auto& p = *pass_;
  const std::string who = call + " with StreamingDataLoader(" + dataset_.dir().string() + ")";
  LF_CHECK(!p.started, ValueError, who, ": the loader has begun a pass; set it up before its first for loop.");
  const auto& o = options_;
  LF_CHECK((o.world_size_ < 0 || o.world_size_ == replicas) && (o.rank_ < 0 || o.rank_ == rank), ValueError, who,
           ": the loader's options set world_size ", o.world_size_, " and rank ", o.rank_, ", and the strategy's data "
           "ranks are ", replicas, " with this rank ", rank, " (tensor, context and pipe peers read the same batches). "
           "Leave world_size and rank unset and Fabric sets them, or do not pass the loader to setup_dataloaders.");
  drop_last_ = o.drop_last_.value_or(replicas > 1);
  p.spec.drop_last = drop_last_;
  p.spec.world_size = replicas;
  p.rank = rank;
  device_ = device;
  if (device.is_cuda()) options_.pin_memory_ = true;  // the copy to the device then does not block
}

StreamingDataLoader::~StreamingDataLoader() { pass_->stop_reading(); }

void StreamingDataLoader::set_epoch(int64_t epoch) {
  LF_CHECK(epoch >= 1, ValueError, "StreamingDataLoader.set_epoch(", epoch, "): epochs count from 1, as LitData's");
  pass_->chosen_epoch = epoch;
}

int64_t StreamingDataLoader::epoch() const {
  const auto& p = *pass_;
  if (p.started && !p.finished) return p.epoch;
  if (p.saved && !p.saved->finished) return p.saved->epoch;
  if (p.chosen_epoch) return *p.chosen_epoch;
  if (p.started) return p.epoch;
  if (p.saved) return p.saved->epoch + 1;
  return p.next_epoch;
}
int64_t StreamingDataLoader::batches_per_pass() const {
  const auto& p = *pass_;
  if (p.started) return static_cast<int64_t>(p.batches.size());
  auto spec = p.spec;
  spec.epoch = epoch();
  return static_cast<int64_t>(data_detail::rank_batches(dataset_.chunk_sizes(), spec, static_cast<int>(p.rank)).size());
}
int64_t StreamingDataLoader::batches_taken() const { return pass_->started ? pass_->current.taken : 0; }
double StreamingDataLoader::wait_seconds() const { return pass_->wait; }

void StreamingDataLoader::start_pass() {
  auto& p = *pass_;
  p.stop_reading();
  p.history.clear();
  p.current = p.own_stage();
  p.drop_last = p.spec.drop_last;
  if (p.saved && !p.saved->finished) {  // a loaded position wins over set_epoch, as in LitData
    p.epoch = p.saved->epoch;
    p.drop_last = p.saved->drop_last;
    p.history = p.saved->stages;
    const data_detail::Stage last = p.history.back();
    p.history.pop_back();
    if (last.same_topology(p.current)) {
      p.current.taken = last.taken;
    } else {
      p.history.push_back(last);
    }
  } else {
    p.epoch = p.chosen_epoch ? *p.chosen_epoch : p.saved ? p.saved->epoch + 1 : p.next_epoch;
  }
  p.saved.reset();
  p.chosen_epoch.reset();
  p.next_epoch = p.epoch + 1;
  auto spec = p.spec;
  spec.epoch = p.epoch;
  spec.drop_last = p.drop_last;
  p.batches = data_detail::plan(dataset_.chunk_sizes(), spec, p.history, p.current, p.rank);
  p.current.taken = std::min<int64_t>(p.current.taken, static_cast<int64_t>(p.batches.size()));
  p.started = true;
  p.finished = false;
  p.wait = 0;
  p.claim = p.consumed = p.current.taken;
  const int64_t total = static_cast<int64_t>(p.batches.size());
  plan_chunks();
  for (int t = 0; t < options_.threads_; ++t) {
    p.threads.emplace_back([this, total] {
      auto& p = *pass_;
      for (;;) {
        int64_t b;
        {
          std::unique_lock<std::mutex> lock(p.mutex);
          p.changed.wait(lock, [&] {
            return p.stop || (p.claim < total && p.claim - p.consumed < options_.prefetch_batches_ &&
                              (p.ready_bytes < options_.max_prefetch_bytes_ || p.ready.empty()));
          });
          if (p.stop) return;
          b = p.claim++;
        }
        data_detail::Ready result;
        try {
          auto batch = std::make_shared<StreamingBatch>();
          batch->indices = p.batches[b];
          std::vector<c10::IValue> items;
          items.reserve(batch->indices.size());
          for (int64_t index : batch->indices) items.push_back(dataset_.get(index));
          if (options_.collate_) {
            batch->data = collate_items(items);
          } else {
            c10::impl::GenericList list(c10::AnyType::get());
            for (auto& item : items) list.push_back(std::move(item));
            batch->data = list;
          }
          if (options_.pin_memory_) batch->data = pinned(batch->data);
          result.bytes = tensor_bytes(batch->data);
          result.batch = std::move(batch);
        } catch (...) {
          result.error = std::current_exception();
        }
        {
          std::lock_guard<std::mutex> lock(p.mutex);
          p.ready_bytes += result.bytes;
          p.ready.emplace(b, std::move(result));
        }
        p.changed.notify_all();
      }
    });
  }
}

void StreamingDataLoader::plan_chunks() {
  auto& p = *pass_;
  p.release_after.clear();
  const int64_t budget = dataset_.cache_budget();
  if (budget == 0 || p.current.taken >= static_cast<int64_t>(p.batches.size())) return;  // a local folder
  // The chunks the rest of the pass reads, in the order it first reads them, with the batches
  // where each is first and last read.
  const auto& sizes = dataset_.chunk_sizes();
  std::vector<int64_t> starts;
  int64_t start = 0;
  for (int64_t size : sizes) starts.push_back(start), start += size;
  struct Span {
    size_t chunk;
    int64_t first, last;
  };
  std::vector<Span> order;
  std::map<size_t, size_t> where;  // chunk -> its place in order
  for (int64_t b = p.current.taken; b < static_cast<int64_t>(p.batches.size()); ++b) {
    for (int64_t index : p.batches[b]) {
      const size_t c = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), index) - starts.begin()) - 1;
      const auto [it, added] = where.emplace(c, order.size());
      if (added) order.push_back({c, b, b});
      else order[it->second].last = b;
    }
  }
  // The bytes of the chunks held at once must fit this process's share of the node's budget, or
  // ranks that wait for each other in a collective could wait for each other's chunks too. A chunk
  // is held from when the reading threads, up to prefetch_batches ahead of the loop, first read it
  // until the loop has taken its last batch; with num_workers > 1 the order interleaves that many
  // workers' chunks.
  std::map<int64_t, int64_t> change;  // loop position -> bytes held from there, minus bytes let go before it
  for (const Span& span : order) {
    p.release_after[span.last].push_back(span.chunk);
    change[span.first - options_.prefetch_batches_] += dataset_.chunk_object_bytes(span.chunk);
    change[span.last + 1] -= dataset_.chunk_object_bytes(span.chunk);
  }
  int64_t at_once = 0, most = 0, largest = 0;
  for (const auto& [batch, bytes] : change) most = std::max(most, at_once += bytes);
  for (const Span& span : order) largest = std::max(largest, dataset_.chunk_object_bytes(span.chunk));
  const int local = std::max(1, env_int("LOCAL_WORLD_SIZE", 1));
  const int64_t share = budget / local;
  LF_CHECK(most <= share, ValueError, "StreamingDataLoader(", dataset_.dir().string(), "): this pass reads up to ", most,
           " bytes of chunks at once (num_workers ", options_.num_workers_, " interleaves that many workers' chunks, "
           "and the reading threads read up to prefetch_batches ", options_.prefetch_batches_, " ahead), "
           "more than this process's share of the cache budget: max_cache_bytes ", budget, " / ", local,
           " processes on the node (LOCAL_WORLD_SIZE). Raise max_cache_bytes to at least ", most * local, ".");
  // How many chunks ahead: prefetch_chunks, within the share beside the chunks read at once.
  const int64_t ahead = std::min<int64_t>(options_.prefetch_chunks_, (share - most) / std::max<int64_t>(1, largest));
  if (ahead <= 0) return;
  p.threads.emplace_back([this, order = std::move(order), ahead] {
    auto& p = *pass_;
    std::vector<const Span*> fetched;  // fetched ahead, not yet reached by the loop
    for (const Span& span : order) {
      for (;;) {
        {
          std::unique_lock<std::mutex> lock(p.mutex);
          p.changed.wait(lock, [&] {
            fetched.erase(std::remove_if(fetched.begin(), fetched.end(),
                                         [&](const Span* each) { return each->first <= p.consumed; }),
                          fetched.end());
            return p.stop || static_cast<int64_t>(fetched.size()) < ahead;
          });
          if (p.stop) return;
          if (span.first <= p.consumed) break;  // the readers are at it already: they fetch it
        }
        bool done = false;
        try {
          done = dataset_.fetch_ahead(span.chunk);
        } catch (const std::exception&) {
          return;  // the reader that needs the chunk fetches it and reports the failure
        }
        std::unique_lock<std::mutex> lock(p.mutex);
        if (done) {
          fetched.push_back(&span);
          break;
        }
        p.changed.wait_for(lock, std::chrono::milliseconds(100));  // no room yet: again when the loop moves
        if (p.stop) return;
      }
    }
  });
}

std::shared_ptr<StreamingBatch> StreamingDataLoader::next_batch() {
  auto& p = *pass_;
  if (p.consumed >= static_cast<int64_t>(p.batches.size())) {
    p.finished = true;
    p.stop_reading();
    return nullptr;
  }
  LF_CHECK(!p.threads.empty(), RuntimeError,
           "StreamingDataLoader: this pass was stopped (a batch failed to read, or load_state_dict ran); "
           "start a new pass with begin() (a new for loop)");
  data_detail::Ready result;
  {
    std::unique_lock<std::mutex> lock(p.mutex);
    const auto start = std::chrono::steady_clock::now();
    p.changed.wait(lock, [&] { return p.ready.count(p.consumed) > 0; });
    p.wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto found = p.ready.find(p.consumed);
    result = std::move(found->second);
    p.ready.erase(found);
    p.ready_bytes -= result.bytes;
    ++p.consumed;
  }
  p.changed.notify_all();
  if (result.error) {
    p.stop_reading();
    std::rethrow_exception(result.error);
  }
  p.current.taken = p.consumed;
  const auto read = p.release_after.find(p.consumed - 1);  // every batch using these chunks is read
  if (read != p.release_after.end())
    for (size_t chunk : read->second) dataset_.release_chunk(chunk);
  if (device_) {
    const bool non_blocking = options_.pin_memory_;
    result.batch->data = map_tensors(result.batch->data, [&](const at::Tensor& tensor) {
      return tensor.to(*device_, /*non_blocking=*/non_blocking);
    });
  }
  return result.batch;
}

StreamingDataLoader::Iterator StreamingDataLoader::begin() {
  start_pass();
  Iterator it;
  it.batch_ = next_batch();
  it.loader_ = it.batch_ ? this : nullptr;
  return it;
}

StreamingDataLoader::Iterator& StreamingDataLoader::Iterator::operator++() {
  batch_ = loader_->next_batch();
  if (!batch_) loader_ = nullptr;
  return *this;
}

StateDict StreamingDataLoader::state_dict() const {
  const auto& p = *pass_;
  int64_t epoch;
  bool finished;
  bool drop_last = p.spec.drop_last;
  std::vector<data_detail::Stage> stages;
  if (p.saved && !p.started) {
    epoch = p.saved->epoch;
    finished = p.saved->finished;
    stages = p.saved->stages;
    drop_last = p.saved->drop_last;
  } else if (p.started) {
    epoch = p.epoch;
    finished = p.finished;
    stages = p.history;
    stages.push_back(p.current);
    drop_last = p.drop_last;
  } else {
    epoch = this->epoch();
    finished = false;
    stages.push_back(p.own_stage());
  }
  const bool loaded_pending = p.saved && !p.saved->finished && !p.started;
  if (p.chosen_epoch && (!p.started || p.finished) && !loaded_pending) {  // the next pass's epoch, as begin() picks it
    epoch = *p.chosen_epoch;
    finished = false;
    stages = {p.own_stage()};
    drop_last = p.spec.drop_last;
  }
  c10::List<int64_t> worlds, workers, sizes, taken;
  for (const auto& stage : stages) {
    worlds.push_back(stage.world_size);
    workers.push_back(stage.num_workers);
    sizes.push_back(stage.batch_size);
    taken.push_back(stage.taken);
  }
  StateDict state = make_state_dict();
  state.insert("state_version", int64_t{1});
  state.insert("current_epoch", epoch);
  state.insert("finished", finished);
  state.insert("num_samples_yielded", stages.back().taken * stages.back().batch_size);
  state.insert("stage_world_sizes", worlds);
  state.insert("stage_num_workers", workers);
  state.insert("stage_batch_sizes", sizes);
  state.insert("stage_batches_taken", taken);
  state.insert("seed", static_cast<int64_t>(p.spec.seed));
  state.insert("shuffle", p.spec.shuffle);
  state.insert("drop_last", drop_last);
  state.insert("item_shuffle_window", p.spec.item_window);
  state.insert("dataset_items", dataset_.size());
  state.insert("dataset_chunks", static_cast<int64_t>(dataset_.chunk_sizes().size()));
  return state;
}

void StreamingDataLoader::load_state_dict(const StateDict& state) {
  auto& p = *pass_;
  const std::string who = "StreamingDataLoader.load_state_dict";
  auto get = [&](const char* key) -> c10::IValue {
    LF_CHECK(state.contains(key), ValueError, who, ": the entry lacks \"", key,
             "\"; it was not saved from a StreamingDataLoader");
    return state.at(key);
  };
  LF_CHECK(get("state_version").toInt() == 1, ValueError, who, ": state_version ", get("state_version").toInt(),
           " is not one this version reads (1)");
  auto same = [&](const char* key, const c10::IValue& ours, const std::string& fix) {
    const c10::IValue saved = get(key);
    LF_CHECK(saved == ours, ValueError, who, ": the checkpoint's loader had ", key, "=", saved, ", this one has ", key,
             "=", ours, "; ", fix);
  };
  const std::string same_options = "set the same option as the saving job, so the resumed pass reads the rest of its order";
  same("dataset_items", c10::IValue(dataset_.size()), "the checkpoint was saved while reading another dataset");
  same("dataset_chunks", c10::IValue(static_cast<int64_t>(dataset_.chunk_sizes().size())),
       "the checkpoint was saved while reading another dataset");
  same("seed", c10::IValue(static_cast<int64_t>(p.spec.seed)), same_options);
  same("shuffle", c10::IValue(p.spec.shuffle), same_options);
  same("item_shuffle_window", c10::IValue(p.spec.item_window), same_options);
  auto ints = [&](const char* key) {  // saved as an int list, read back from a file as a generic one
    std::vector<int64_t> values;
    const c10::IValue list = get(key);
    LF_CHECK(list.isList(), ValueError, who, ": \"", key, "\" is not a list; the entry is damaged");
    for (const auto& value : list.toListRef()) {
      LF_CHECK(value.isInt(), ValueError, who, ": \"", key, "\" holds a ", value.tagKind(), "; the entry is damaged");
      values.push_back(value.toInt());
    }
    return values;
  };
  const auto worlds = ints("stage_world_sizes"), workers = ints("stage_num_workers"), sizes = ints("stage_batch_sizes"),
             taken = ints("stage_batches_taken");
  LF_CHECK(!worlds.empty() && worlds.size() == workers.size() && worlds.size() == sizes.size() &&
               worlds.size() == taken.size(),
           ValueError, who, ": the entry's stage lists are damaged");
  data_detail::LoaderPass::Saved saved;
  saved.epoch = get("current_epoch").toInt();
  saved.finished = get("finished").toBool();
  saved.drop_last = get("drop_last").toBool();
  for (size_t i = 0; i < worlds.size(); ++i) {
    LF_CHECK(worlds[i] >= 1 && workers[i] >= 1 && sizes[i] >= 1 && taken[i] >= 0, ValueError, who,
             ": the entry's stage ", i, " is damaged");
    saved.stages.push_back({worlds[i], workers[i], sizes[i], taken[i]});
  }
  p.stop_reading();
  p.started = false;
  p.chosen_epoch.reset();
  p.saved = std::move(saved);
}

}  // namespace lightning::fabric
