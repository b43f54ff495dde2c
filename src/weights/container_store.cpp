#include "weights/container_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <utility>

#include "core/error.h"
#include "core/memory.h"
#include "formats/safetensors.h"
#include "quant/blocks.h"
#include "quant/matmul.h"
#include "quant/types.h"
#include "tokenizer/tekken.h"
#include "weights/expected.h"
#include "weights/extra_component.h"
#include "weights/family.h"
#include "weights/gguf_source.h"
#include "weights/naming.h"

namespace klein {

namespace fs = std::filesystem;

namespace {

Component component_of(const std::string& canonical) {
  if (canonical.rfind("transformer.", 0) == 0) return Component::Transformer;
  if (canonical.rfind("text_encoder.", 0) == 0) return Component::TextEncoder;
  return Component::Vae;
}

TokenizerBytes container_tokenizer(const nlohmann::json& meta, const fs::path& path) {
  TokenizerBytes out;
  const std::string where = path.string();
  out.origin = where + " (tokenizer stored in the container)";
  check(meta.contains("tokenizer") && meta["tokenizer"].is_object(), where,
        ": the container holds no tokenizer");
  const auto& tok = meta["tokenizer"];
  auto take = [&](const char* key, std::optional<std::string>& into) {
    if (!tok.contains(key)) return;
    check(tok[key].is_string(), where, ": tokenizer file ", key,
          " in the metadata is not a string");
    into = tok[key].get<std::string>();
  };
  take("vocab.json", out.vocab_json);
  take("merges.txt", out.merges_txt);
  take("tokenizer_config.json", out.tokenizer_config_json);
  take("tokenizer.json", out.tokenizer_json);
  return out;
}

}  // namespace

// A unit's views into the mapping.
class ContainerStore::Unit final : public WeightUnit {
 public:
  Unit(std::string name, std::string prefix) : WeightUnit(std::move(name), std::move(prefix)) {}
  using WeightUnit::add;
};

uint64_t stored_tensor_bytes(const std::string& name, DType type, uint8_t layout,
                             uint32_t block_size, const Shape& shape) {
  const uint64_t n = uint64_t(numel(shape));
  const quant::StorageType* st = quant::find_storage_type(type);
  check(st != nullptr, "tensor ", name, " is stored as ", dtype_name(type),
        ", which a container cannot hold");
  if (!st->quantized) {
    check(layout == 0, "tensor ", name, ": ", dtype_name(type), " with layout ", int(layout),
          " is not readable (plain float types are row-major, layout 0)");
    return n * dtype_size(type);
  }
  check(layout <= uint8_t(quant::Layout::Interleaved16), "tensor ", name, ": ", dtype_name(type),
        " layout ", int(layout), " is unknown to this program (written by a newer klein?)");
  check(block_size == uint32_t(quant::kBlock), "tensor ", name, ": ", dtype_name(type),
        " with blocks of ", block_size, " values; this program reads blocks of ", quant::kBlock);
  const int64_t rows = shape.empty() ? 1 : shape[0];
  const int64_t cols = rows > 0 ? int64_t(n) / rows : 0;
  check(shape.size() >= 2 && cols % quant::kBlock == 0, "tensor ", name, " ", shape_str(shape),
        " cannot be ", dtype_name(type), ": rows must be whole blocks of ", quant::kBlock);
  return quant::storage_bytes(type, quant::Layout(layout), rows, cols);
}

ContainerStore::ContainerStore(const fs::path& path, ContainerOptions options)
    : file_(path), options_(options) {
  const std::string where = path.string();
  const auto& meta = file_.metadata();
  check(meta.contains("config"), where, ": the container metadata has no model configuration");
  config_ = model_config_from_json(meta["config"], where + " (metadata config)");

  const ModelFamily& family = model_family(config_);
  ShapeMap shapes[3];
  for (const auto& u : file_.index().units) {
    UnitState s;
    s.entry = &u;
    for (const auto& t : file_.tensors_of(u)) {
      const auto belongs = unit_of(family, t.name);
      check(belongs && belongs->unit == u.name, where, ": tensor ", t.name, " is stored in unit ",
            u.name, " but belongs to ", belongs ? belongs->unit : std::string("no unit"));
      s.prefix = belongs->prefix;
      const uint64_t expected =
          stored_tensor_bytes(t.name, t.type, t.layout, t.block_size, t.shape);
      check(t.size == expected, where, ": tensor ", t.name, " ", shape_str(t.shape), " as ",
            dtype_name(t.type), " should take ", expected, " bytes, the index says ", t.size);
      // A network beside the model (weights/extra_component.h: the safety classifier, a
      // control model): its tensors are checked against its own configuration, from the
      // metadata object of its key, when it is opened.
      if (const std::string key = extra_component_key(t.name); !key.empty()) {
        check(meta.contains(key) && meta[key].is_object(), where, ": tensor ", t.name,
              " belongs to the network stored as \"", key, "\", but the metadata has no \"", key,
              "\" configuration");
        continue;
      }
      shapes[int(component_of(t.name))][t.name] = t.shape;
    }
    order_.push_back(u.name);
    units_[u.name] = std::move(s);
  }
  for (Component c : {Component::Transformer, Component::TextEncoder, Component::Vae})
    check_tensors(expected_tensors(config_, c), shapes[int(c)], c, where);
}

ContainerStore::~ContainerStore() {
  // Kept units tell the store when they go: destroy them while it is whole.
  std::vector<UnitRef> kept;
  {
    std::lock_guard lock(mutex_);
    kept = take_kept_locked("");
  }
  kept.clear();
  // The checking thread reads the mapping: it ends (after the check it is running, if any)
  // before the mapping goes.
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  check_queued_.notify_all();
  if (checker_.joinable()) checker_.join();
}

std::vector<std::string> ContainerStore::units() const { return order_; }

bool ContainerStore::has_quantized(const std::string& prefix) const {
  for (const auto& u : file_.index().units)
    for (const auto& t : file_.tensors_of(u))
      if (t.name.rfind(prefix, 0) == 0 && quant::is_quantized(t.type)) return true;
  return false;
}

std::string ContainerStore::identity() const {
  return "klein-container:" + container::hex64(file_.header().header_xxh3);
}

void ContainerStore::check_unit_locked(UnitState& s, std::unique_lock<std::mutex>& lock) {
  if (!options_.check_units) return;
  for (;;) {
    if (s.check == Check::Running) {
      // Another thread is checking these pages (the checking thread, or an acquire of the
      // same unit): one check serves both.
      check_ended_.wait(lock, [&] { return s.check != Check::Running; });
      continue;
    }
    if (s.check_error) {
      // Thrown once; the next acquire checks again.
      std::exception_ptr error = std::exchange(s.check_error, nullptr);
      std::rethrow_exception(error);
    }
    if (s.checked) return;
    // Never asked for, or queued and not reached yet: checked here, now.
    run_check_locked(s, lock);
  }
}

ContainerStore::Checks ContainerStore::checks() const {
  std::lock_guard lock(mutex_);
  return checks_;
}

void ContainerStore::run_check_locked(UnitState& s, std::unique_lock<std::mutex>& lock) {
  s.check = Check::Running;
  const bool ahead = std::this_thread::get_id() == checker_.get_id();
  ++(ahead ? checks_.background : checks_.on_acquire);
  const container::UnitEntry* e = s.entry;
  const uint32_t drops = s.drops;
  // Paged, the check drops what it has hashed: the pages stay in the page cache and come in
  // again as the unit is used, so that only what the network touches is in the process (a
  // check ahead of use would otherwise hold two units at once, and a check of an embedding
  // table all of it, where a prompt reads a few rows).
  const bool drop = options_.residency == Residency::Paged;
  lock.unlock();
  std::exception_ptr error;
  try {
    file_.check_unit(*e, drop);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  s.check = Check::Idle;
  s.check_error = error;
  if (!error && s.drops == drops) s.checked = true;
  check_ended_.notify_all();
}

void ContainerStore::checker_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    check_queued_.wait(lock, [&] { return stopping_ || queue_size_ > 0; });
    if (stopping_) return;
    UnitState& s = *queue_[queue_head_];
    queue_head_ = (queue_head_ + 1) % queue_.size();
    --queue_size_;
    s.in_queue = false;
    if (s.check == Check::Queued) run_check_locked(s, lock);  // else an acquire took it
  }
}

UnitRef ContainerStore::acquire(const std::string& unit) {
  const auto started = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  const AcquireTime timed{tracker_, started};
  auto it = units_.find(unit);
  if (it == units_.end()) fail(file_.path().string(), ": the container has no weight unit ", unit);
  UnitState& s = it->second;
  const container::UnitEntry& e = *s.entry;
  if (auto held = s.live.lock()) {
    tracker_.acquired(unit, e.size);
    return held;
  }
  check_unit_locked(s, lock);
  if (auto held = s.live.lock()) {  // built by another thread while we waited
    tracker_.acquired(unit, e.size);
    return held;
  }
  // A unit is paged in when a layer starts: give back what the allocator holds free from
  // the layers before. Its heaps fragment around long-lived small objects (the units a
  // resident store keeps, allocated between layers), and freed scratch inside them would
  // otherwise stay in the RSS: 0.5 GB over the 27 text-encoder layers at Q4.
  return_free_memory();
  if (!s.views) {
    auto u = std::make_unique<Unit>(unit, s.prefix);
    for (const auto& t : file_.tensors_of(e)) {
      Weight w;
      w.name = t.name;
      w.dtype = t.type;
      w.shape = t.shape;
      w.data = file_.at(t.offset);
      w.nbytes = size_t(t.size);
      w.layout = t.layout;
      u->add(std::move(w));
    }
    s.views = std::move(u);
  }
  // The unit's views are built once; each paging in makes a new lease in the unit's slot
  // (no allocation), whose end drops the pages again.
  s.live.reset();
  const std::string* name = &it->first;
  UnitRef ref = lease_unit(s.views.get(), &s.slot, [this, name] { unit_gone(*name); });
  s.live = ref;
  if (options_.residency == Residency::Resident) s.kept = ref;
  tracker_.acquired(unit, e.size);
  return ref;
}

void ContainerStore::prefetch(const std::string& unit) {
  std::lock_guard lock(mutex_);
  auto it = units_.find(unit);
  if (it == units_.end() || !read_ahead_) return;
  UnitState& s = it->second;
  const container::UnitEntry& e = *s.entry;
  if (!s.live.expired()) return;  // held: its pages are in already
  tracker_.prefetched(unit, e.size);
  ::madvise(const_cast<std::byte*>(file_.at(e.offset)), size_t(e.size), MADV_WILLNEED);
  if (!options_.check_units || s.checked || s.check != Check::Idle) return;
  // The check goes to the checking thread, which runs it while the unit before computes.
  s.check = Check::Queued;
  if (!s.in_queue) {
    if (queue_.empty()) queue_.resize(units_.size());  // one entry per unit at most
    queue_[(queue_head_ + queue_size_) % queue_.size()] = &s;
    ++queue_size_;
    s.in_queue = true;
  }
  if (!checker_.joinable()) checker_ = std::thread([this] { checker_loop(); });
  check_queued_.notify_one();
}

void ContainerStore::drop_pages(UnitState& s) {
  // Its pages come from the file again next time: check them again then, so a file rewritten
  // during the run is caught at the next page-in of every unit it touches.
  s.checked = false;
  ++s.drops;
  const container::UnitEntry& e = *s.entry;
  if (e.size == 0) return;
  // Units start on the container's alignment (>= 64 KiB, so on a page); round the end up.
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t len = (size_t(e.size) + page - 1) / page * page;
  ::madvise(const_cast<std::byte*>(file_.at(e.offset)), len, MADV_DONTNEED);
}

void ContainerStore::unit_gone(const std::string& name) {
  std::lock_guard lock(mutex_);
  auto it = units_.find(name);
  if (it == units_.end()) return;
  UnitState& s = it->second;
  if (!s.live.expired()) return;  // acquired again meanwhile: a new object holds the pages
  drop_pages(s);
  tracker_.dropped(name);
}

std::vector<UnitRef> ContainerStore::take_kept_locked(const std::string& prefix) {
  std::vector<UnitRef> kept;
  for (auto& [name, s] : units_) {
    if (name.rfind(prefix, 0) != 0) continue;
    if (s.kept) {
      kept.push_back(std::move(s.kept));
      s.kept.reset();
    } else if (s.live.expired() && tracker_.resident(name)) {
      drop_pages(s);  // read ahead and never acquired
      tracker_.dropped(name);
    }
  }
  return kept;
}

void ContainerStore::set_residency(Residency r) {
  std::vector<UnitRef> kept;
  {
    std::lock_guard lock(mutex_);
    options_.residency = r;
    if (r == Residency::Paged) kept = take_kept_locked("");
  }
  kept.clear();  // unit_gone drops the units nobody else holds
}

Residency ContainerStore::residency() const {
  std::lock_guard lock(mutex_);
  return options_.residency;
}

uint64_t ContainerStore::unit_bytes(const std::string& unit) const {
  auto it = units_.find(unit);
  return it == units_.end() ? 0 : it->second.entry->size;
}

void ContainerStore::release(const std::string& prefix) {
  std::vector<UnitRef> kept;
  {
    std::lock_guard lock(mutex_);
    kept = take_kept_locked(prefix);
  }
  kept.clear();
}

StoreOrigin ContainerStore::origin() const {
  StoreOrigin o;
  o.files.push_back(file_.path());
  o.container_metadata = &file_.metadata();
  return o;
}

TokenizerBytes read_tokenizer_files(const ModelPaths& paths, const WeightStore* opened) {
  const TokenizerSource source = tokenizer_source(paths);
  switch (source.kind) {
    case TokenizerSource::Kind::Container: {
      // The container the weights were opened from: its metadata (which holds the tokenizer
      // files, several MB of JSON) is parsed already.
      if (opened) {
        const StoreOrigin o = opened->origin();
        std::error_code ec;
        if (o.container_metadata && o.files.size() == 1 &&
            fs::equivalent(o.files[0], source.path, ec))
          return container_tokenizer(*o.container_metadata, source.path);
      }
      return container_tokenizer(container::ContainerFile(source.path).metadata(), source.path);
    }
    case TokenizerSource::Kind::Gguf:
      return gguf_tokenizer(gguf::File(source.path));
    case TokenizerSource::Kind::Tekken: {
      const SafetensorsSet& set = *source.tekken_files;
      const SafetensorsSet::Located* t = set.find(kTekkenTensor);
      const std::string where = source.path.string() + ": tensor " + kTekkenTensor;
      check(t && t->entry->dtype == DType::U8 && t->entry->shape.size() == 1, where,
            " must be the bytes of a tekken.json (U8, one dimension)");
      const TensorView v = t->file->view(*t->entry);
      return tekken_tokenizer(
          std::string_view(static_cast<const char*>(v.data), v.nbytes),
          where);
    }
    case TokenizerSource::Kind::Directory:
      break;
  }
  const fs::path& dir = source.path;
  TokenizerBytes out;
  out.origin = dir.string();
  auto take = [&](const char* name, std::optional<std::string>& into) {
    if (fs::exists(dir / name)) into = read_text_file(dir / name);
  };
  take("vocab.json", out.vocab_json);
  take("merges.txt", out.merges_txt);
  take("tokenizer_config.json", out.tokenizer_config_json);
  take("tokenizer.json", out.tokenizer_json);
  // Mistral's own file, where the transformers files are not there.
  if (!out.tokenizer_json && !out.vocab_json && fs::exists(dir / "tekken.json"))
    return tekken_tokenizer(read_text_file(dir / "tekken.json"), (dir / "tekken.json").string());
  return out;
}

}  // namespace klein
