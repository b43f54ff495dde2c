#include "weights/source_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/memory.h"
#include "weights/gguf_source.h"
#include "weights/family.h"
#include "weights/fp8.h"

namespace klein {

std::optional<Weight> SourceComponent::stored(const std::string& name) const {
  if (gguf) {
    const gguf::TensorInfo* t = gguf->find(name);
    if (!t) return std::nullopt;
    return gguf_weight(*gguf, *t);
  }
  const auto* located = files->find(name);
  if (!located) return std::nullopt;
  const TensorView v = located->file->view(*located->entry);
  Weight w;
  w.name = name;
  w.dtype = v.dtype;
  w.shape = v.shape;
  w.data = v.data;
  w.nbytes = v.nbytes;
  return w;
}

std::vector<const MappedFile*> SourceComponent::mapped() const {
  if (gguf) return {&gguf->mapping()};
  std::vector<const MappedFile*> out;
  for (const auto& f : files->files()) out.push_back(&f->mapping());
  return out;
}

std::filesystem::path SourceComponent::path() const { return gguf ? gguf->path() : files->path(); }

// A unit's views (and the buffers of tensors that could not be plain views); tells the
// store when its last reference goes.
class SourceStore::Unit final : public WeightUnit {
 public:
  Unit(SourceStore& store, std::string name, std::string prefix)
      : WeightUnit(std::move(name), std::move(prefix)), store_(store) {}
  ~Unit() override {
    if (registered) store_.unit_gone(name());
  }
  using WeightUnit::add;
  std::vector<std::vector<std::byte>> owned;
  // Set once the store lists the unit as live: a unit whose building failed (an fp8 weight
  // holding NaN) goes without telling the store, whose lock is held while it is built.
  bool registered = false;

 private:
  SourceStore& store_;
};

SourceStore::SourceStore(std::vector<SourceComponent> components, ModelConfig config,
                         std::string identity)
    : components_(std::move(components)), config_(std::move(config)), identity_(std::move(identity)) {
  for (const auto& c : components_)
    for (const auto& t : c.tensors) {
      auto u = unit_of(model_family(config_), t.canonical);
      if (!u) continue;  // never read by inference
      units_[u->unit].push_back({&c, &t});
      prefixes_[u->unit] = u->prefix;
    }
  for (const auto& [name, pending] : units_) {
    uint64_t n = 0, decoded = 0;
    for (const auto& [data, size] : ranges_of(name)) n += size;
    // An fp8 weight decoded when its unit is acquired (decode_fp8_, on unless a convert asks
    // otherwise) is held as float32: three bytes a value more than its codes.
    for (const auto& p : pending)
      if (const auto* l = p.component->files ? p.component->files->find(p.source->source) : nullptr;
          l && dtype_is_fp8(l->entry->dtype))
        decoded += 3 * uint64_t(numel(canonical_shape(*p.source, l->entry->shape)));
    bytes_[name] = n;
    fp8_decoded_extra_[name] = decoded;
  }
}

SourceStore::~SourceStore() {
  std::vector<UnitRef> kept;
  {
    std::lock_guard lock(mutex_);
    kept = take_kept_locked("");
  }
  kept.clear();
}

std::vector<std::string> SourceStore::units() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : units_) out.push_back(name);
  return out;
}

std::vector<std::pair<const std::byte*, size_t>> SourceStore::ranges_of(
    const std::string& unit) const {
  std::vector<std::pair<const std::byte*, size_t>> out;
  auto it = units_.find(unit);
  if (it == units_.end()) return out;
  for (const auto& p : it->second) {
    const std::optional<Weight> v = p.component->stored(p.source->source);
    if (!v) continue;
    const std::byte* data = static_cast<const std::byte*>(v->data);
    size_t nbytes = v->nbytes;
    if (p.source->row_end >= 0 && v->shape[0] > 0) {
      const size_t row_bytes = v->nbytes / size_t(v->shape[0]);
      data += size_t(p.source->row_begin) * row_bytes;
      nbytes = size_t(p.source->row_end - p.source->row_begin) * row_bytes;
    }
    out.emplace_back(data, nbytes);
  }
  return out;
}

void SourceStore::advise(const std::string& unit, int advice) const {
  // The mappings start on pages; a tensor's range is widened to whole pages.
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  for (const auto& [data, size] : ranges_of(unit)) {
    if (size == 0) continue;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size + page - 1) / page * page;
    ::madvise(reinterpret_cast<void*>(begin), end - begin, advice);
  }
}

UnitRef SourceStore::acquire(const std::string& unit) {
  const auto started = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  const AcquireTime timed{tracker_, started};
  if (auto it = live_.find(unit); it != live_.end())
    if (auto held = it->second.lock()) {
      tracker_.acquired(unit, unit_bytes(unit));
      return held;
    }
  auto it = units_.find(unit);
  if (it == units_.end()) fail("the model has no weight unit ", unit);
  // A unit is paged in when a layer starts: give back what the allocator holds free from
  // the layers before. Its heaps fragment around long-lived small objects (the units a
  // resident store keeps, allocated between layers), and freed scratch inside them would
  // otherwise stay in the RSS: 0.5 GB over the 27 text-encoder layers at Q4.
  return_free_memory();
  auto u = std::make_shared<Unit>(*this, unit, prefixes_[unit]);
  for (const auto& p : it->second) {
    const TensorSource& src = *p.source;
    const std::optional<Weight> v = p.component->stored(src.source);
    check(v.has_value(), "internal: tensor ", src.source, " vanished");
    Weight w = *v;
    w.name = src.canonical;
    if (src.row_end >= 0) {
      const size_t row_bytes = v->nbytes / size_t(v->shape[0]);
      w.shape[0] = src.row_end - src.row_begin;
      w.data = static_cast<const std::byte*>(v->data) + size_t(src.row_begin) * row_bytes;
      w.nbytes = size_t(w.shape[0]) * row_bytes;
    }
    if (src.squeeze_1x1) w.shape = {w.shape[0], w.shape[1]};
    if (decode_blocks_ && p.component->gguf && !dtype_is_float(w.dtype)) {
      // GGUF blocks as the float32 values they stand for (decoded as gguf-py does).
      const auto type = w.dtype == DType::Q8 ? gguf::TensorType::Q8_0 : gguf::TensorType(w.layout);
      const int64_t rows = w.rows(), cols = w.cols();
      const size_t row_bytes = rows > 0 ? w.nbytes / size_t(rows) : 0;
      std::vector<std::byte> buf(size_t(rows * cols) * sizeof(float));
      for (int64_t r = 0; r < rows; ++r)
        gguf::decode_row(type, static_cast<const std::byte*>(w.data) + size_t(r) * row_bytes,
                         reinterpret_cast<float*>(buf.data()) + r * cols, cols);
      u->owned.push_back(std::move(buf));
      w.data = u->owned.back().data();
      w.nbytes = u->owned.back().size();
      w.dtype = DType::F32;
      w.layout = 0;
    } else if (dtype_is_fp8(w.dtype)) {
      auto origin = [&] { return src.canonical + " (" + src.source + " in " + p.component->path().string() + ")"; };
      // The scale, as float32 values kept by the unit (one, or one per row of this range).
      std::vector<float> scale;
      if (auto it = p.component->fp8_scales.find(src.source); it != p.component->fp8_scales.end()) {
        const auto* s = p.component->files->find(it->second);
        check(s != nullptr, "internal: scale ", it->second, " vanished");
        scale = fp8_scale_values(s->file->view(*s->entry));
        if (scale.size() > 1 && src.row_end >= 0)
          scale = std::vector<float>(scale.begin() + src.row_begin, scale.begin() + src.row_end);
      }
      const int64_t rows = w.rows(), cols = w.cols();
      if (decode_fp8_) {
        // fp8 (and its scale) to float32, exactly as the checkpoint defines the values.
        std::vector<std::byte> buf(size_t(rows) * size_t(cols) * sizeof(float));
        decode_fp8_rows(w.dtype, static_cast<const std::byte*>(w.data), 0, rows, cols,
                        scale.empty() ? nullptr : scale.data(), int64_t(scale.size()), origin(),
                        reinterpret_cast<float*>(buf.data()));
        u->owned.push_back(std::move(buf));
        w.dtype = DType::F32;
        w.data = u->owned.back().data();
        w.nbytes = u->owned.back().size();
      } else {
        w.origin = origin();  // convert names it when a decoded value is not finite
      }
      if (!decode_fp8_ && !scale.empty()) {
        // As stored: the reader decodes the rows it needs (convert, a slice at a time). The
        // rows' halves are swapped below, and with them a per-row scale's.
        if (scale.size() > 1 && src.swap_halves)
          std::rotate(scale.begin(), scale.begin() + ptrdiff_t(scale.size() / 2), scale.end());
        std::vector<std::byte> buf(scale.size() * sizeof(float));
        std::memcpy(buf.data(), scale.data(), buf.size());
        u->owned.push_back(std::move(buf));
        w.scale = reinterpret_cast<const float*>(u->owned.back().data());
        w.scale_count = int64_t(scale.size());
      }
    }
    if (src.swap_halves && w.nbytes > 0) {
      // Rebuild [second half; first half] so the model always sees diffusers' order (a
      // per-row fp8 scale was turned above).
      std::vector<std::byte> buf(w.nbytes);
      const size_t half = w.nbytes / 2;
      std::memcpy(buf.data(), static_cast<const std::byte*>(w.data) + half, half);
      std::memcpy(buf.data() + half, w.data, half);
      u->owned.push_back(std::move(buf));
      w.data = u->owned.back().data();
    }
    if (src.rope_interleaved_heads > 0 && w.nbytes > 0) {
      // Back to transformers' order of rows (TensorSource): rows are whole, whatever the type.
      const int64_t rows = w.shape[0], heads = src.rope_interleaved_heads;
      check(rows % (2 * heads) == 0, p.component->path().string(), ": tensor ", src.source,
            " has ", rows, " rows, not an even number per each of its ", heads, " heads");
      const int64_t head_rows = rows / heads, half = head_rows / 2;
      const size_t row_bytes = w.nbytes / size_t(rows);
      const auto* from = static_cast<const std::byte*>(w.data);
      std::vector<std::byte> buf(w.nbytes);
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i)
          for (int64_t j = 0; j < 2; ++j)
            std::memcpy(buf.data() + size_t(h * head_rows + j * half + i) * row_bytes,
                        from + size_t(h * head_rows + 2 * i + j) * row_bytes, row_bytes);
      u->owned.push_back(std::move(buf));
      w.data = u->owned.back().data();
    }
    u->add(std::move(w));
  }
  live_[unit] = u;
  u->registered = true;
  if (residency_ == Residency::Resident) kept_[unit] = u;
  tracker_.acquired(unit, unit_bytes(unit));
  return u;
}

void SourceStore::prefetch(const std::string& unit) {
  std::lock_guard lock(mutex_);
  if (!units_.count(unit) || !read_ahead_) return;
  if (auto it = live_.find(unit); it != live_.end() && !it->second.expired()) return;
  tracker_.prefetched(unit, unit_bytes(unit));
  advise(unit, MADV_WILLNEED);
}

void SourceStore::unit_gone(const std::string& name) {
  std::lock_guard lock(mutex_);
  if (auto it = live_.find(name); it != live_.end() && !it->second.expired()) return;
  advise(name, MADV_DONTNEED);
  tracker_.dropped(name);
}

std::vector<UnitRef> SourceStore::take_kept_locked(const std::string& prefix) {
  std::vector<UnitRef> kept;
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (it->first.rfind(prefix, 0) == 0) {
      kept.push_back(std::move(it->second));
      it = kept_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [name, _] : units_) {
    if (name.rfind(prefix, 0) != 0 || !tracker_.resident(name)) continue;
    auto live = live_.find(name);
    const bool held = live != live_.end() && !live->second.expired();
    if (!held) {  // read ahead and never acquired
      advise(name, MADV_DONTNEED);
      tracker_.dropped(name);
    }
  }
  return kept;
}

void SourceStore::set_residency(Residency r) {
  std::vector<UnitRef> kept;
  {
    std::lock_guard lock(mutex_);
    residency_ = r;
    if (r == Residency::Paged) kept = take_kept_locked("");
  }
  kept.clear();
}

Residency SourceStore::residency() const {
  std::lock_guard lock(mutex_);
  return residency_;
}

uint64_t SourceStore::unit_bytes(const std::string& unit) const {
  auto it = bytes_.find(unit);
  if (it == bytes_.end()) return 0;
  auto extra = fp8_decoded_extra_.find(unit);
  return it->second + (decode_fp8_ && extra != fp8_decoded_extra_.end() ? extra->second : 0);
}

void SourceStore::release(const std::string& prefix) {
  std::vector<UnitRef> kept;
  {
    std::lock_guard lock(mutex_);
    kept = take_kept_locked(prefix);
  }
  kept.clear();
}

StoreOrigin SourceStore::origin() const {
  StoreOrigin o;
  for (const auto& c : components_) {
    for (const MappedFile* f : c.mapped()) {
      o.files.push_back(f->path());
      o.mappings.emplace_back(f->data(), f->size());
    }
    if (c.gguf && o.needs_conversion.empty() && !decode_blocks_)
      o.needs_conversion = gguf_needs_conversion(
          *c.gguf, c.component == Component::Transformer ? "--diffusion-model" : "--text-encoder");
    for (const auto& t : c.tensors) {
      if (!unit_of(model_family(config_), t.canonical)) o.unused_tensors.push_back(t.canonical);
      if (const auto* l = c.files ? c.files->find(t.source) : nullptr;
          l && dtype_is_fp8(l->entry->dtype))
        o.stored_types[t.canonical] = l->entry->dtype;
    }
  }
  return o;
}

}  // namespace klein
