#include "weights/container_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/matmul.h"
#include "weights/expected.h"
#include "weights/naming.h"

namespace klein {

namespace fs = std::filesystem;

namespace {

class ContainerUnit final : public WeightUnit {
 public:
  ContainerUnit(std::string name, std::string prefix, const std::byte* begin, size_t size,
                bool drop)
      : WeightUnit(std::move(name), std::move(prefix)), begin_(begin), size_(size), drop_(drop) {}
  ~ContainerUnit() override {
    if (!drop_ || size_ == 0) return;
    // Units start on the container's alignment (>= 64 KiB, so on a page); round the end up.
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    const size_t len = (size_ + page - 1) / page * page;
    ::madvise(const_cast<std::byte*>(begin_), len, MADV_DONTNEED);
  }
  using WeightUnit::add;

 private:
  const std::byte* begin_;
  size_t size_;
  bool drop_;
};

Component component_of(const std::string& canonical) {
  if (canonical.rfind("transformer.", 0) == 0) return Component::Transformer;
  if (canonical.rfind("text_encoder.", 0) == 0) return Component::TextEncoder;
  return Component::Vae;
}

TokenizerBytes container_tokenizer(const container::ContainerFile& file) {
  TokenizerBytes out;
  const std::string where = file.path().string();
  out.origin = where + " (tokenizer stored in the container)";
  const auto& meta = file.metadata();
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

uint64_t stored_tensor_bytes(const std::string& name, DType type, uint8_t layout,
                             uint32_t block_size, const Shape& shape) {
  const uint64_t n = uint64_t(numel(shape));
  if (dtype_is_float(type)) {
    check(layout == 0, "tensor ", name, ": ", dtype_name(type), " with layout ", int(layout),
          " is not readable (plain float types are row-major, layout 0)");
    return n * dtype_size(type);
  }
  check(type == DType::Q8 || type == DType::Q4, "tensor ", name, " is stored as ", dtype_name(type),
        ", which a container cannot hold");
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

  ShapeMap shapes[3];
  for (const auto& u : file_.index().units) {
    UnitState s;
    s.entry = &u;
    for (const auto& t : file_.tensors_of(u)) {
      const auto belongs = unit_of(t.name);
      check(belongs && belongs->unit == u.name, where, ": tensor ", t.name, " is stored in unit ",
            u.name, " but belongs to ", belongs ? belongs->unit : std::string("no unit"));
      s.prefix = belongs->prefix;
      const uint64_t expected =
          stored_tensor_bytes(t.name, t.type, t.layout, t.block_size, t.shape);
      check(t.size == expected, where, ": tensor ", t.name, " ", shape_str(t.shape), " as ",
            dtype_name(t.type), " should take ", expected, " bytes, the index says ", t.size);
      shapes[int(component_of(t.name))][t.name] = t.shape;
    }
    order_.push_back(u.name);
    units_[u.name] = std::move(s);
  }
  check_tensors(expected_transformer(config_.transformer), shapes[int(Component::Transformer)],
                Component::Transformer, where);
  check_tensors(expected_text_encoder(config_.text_encoder), shapes[int(Component::TextEncoder)],
                Component::TextEncoder, where);
  check_tensors(expected_vae(config_.vae), shapes[int(Component::Vae)], Component::Vae, where);
}

ContainerStore::~ContainerStore() {
  // Background checks read the mapping: let them finish before it goes.
  for (auto& [name, s] : units_)
    if (s.checking.valid()) s.checking.wait();
}

std::vector<std::string> ContainerStore::units() const { return order_; }

std::string ContainerStore::identity() const {
  return "klein-container:" + container::hex64(file_.header().header_xxh3);
}

void ContainerStore::check_unit_locked(UnitState& s, std::unique_lock<std::mutex>& lock) {
  if (s.checked || !options_.check_on_first_acquire) return;
  // The check runs without the lock (a big unit takes a while to read); threads wanting the
  // same unit wait for the one check, whether a prefetch or an acquire started it.
  std::shared_future<void> pending = s.checking;
  if (!pending.valid()) {
    const container::UnitEntry* e = s.entry;
    std::packaged_task<void()> task([this, e] { file_.check_unit(*e); });
    pending = s.checking = task.get_future().share();
    lock.unlock();
    task();
  } else {
    lock.unlock();
  }
  pending.wait();
  lock.lock();
  s.checking = {};
  pending.get();  // rethrows the check's error; the next acquire checks again
  s.checked = true;
}

UnitRef ContainerStore::acquire(const std::string& unit) {
  std::unique_lock lock(mutex_);
  auto it = units_.find(unit);
  if (it == units_.end()) fail(file_.path().string(), ": the container has no weight unit ", unit);
  UnitState& s = it->second;
  if (auto held = s.live.lock()) return held;
  check_unit_locked(s, lock);
  if (auto held = s.live.lock()) return held;  // built by another thread while we waited
  const container::UnitEntry& e = *s.entry;
  auto u = std::make_shared<ContainerUnit>(unit, s.prefix, file_.at(e.offset), size_t(e.size),
                                           options_.drop_on_release);
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
  s.live = u;
  return u;
}

void ContainerStore::prefetch(const std::string& unit) {
  std::lock_guard lock(mutex_);
  auto it = units_.find(unit);
  if (it == units_.end()) return;
  UnitState& s = it->second;
  const container::UnitEntry& e = *s.entry;
  ::madvise(const_cast<std::byte*>(file_.at(e.offset)), size_t(e.size), MADV_WILLNEED);
  if (s.checked || s.checking.valid() || !options_.check_on_first_acquire) return;
  const container::ContainerFile* file = &file_;
  s.checking = std::async(std::launch::async, [file, &e] { file->check_unit(e); }).share();
}

TokenizerBytes ContainerStore::tokenizer_files() const { return container_tokenizer(file_); }

TokenizerBytes read_tokenizer_files(const ModelPaths& paths) {
  if (paths.tokenizer.empty() && !paths.model.empty() && container::is_container(paths.model))
    return container_tokenizer(container::ContainerFile(paths.model));
  const fs::path dir = find_tokenizer_dir(paths);
  TokenizerBytes out;
  out.origin = dir.string();
  auto take = [&](const char* name, std::optional<std::string>& into) {
    if (fs::exists(dir / name)) into = read_text_file(dir / name);
  };
  take("vocab.json", out.vocab_json);
  take("merges.txt", out.merges_txt);
  take("tokenizer_config.json", out.tokenizer_config_json);
  take("tokenizer.json", out.tokenizer_json);
  return out;
}

}  // namespace klein
