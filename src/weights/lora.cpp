#include "weights/lora.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "weights/family.h"

namespace klein {

namespace {


// What one tensor of a LoRA file is: a module's A (down), B (up) or alpha.
enum class Part { Down, Up, Alpha };

struct Key {
  std::string module;
  Part part;
};

std::optional<Key> split_key(const std::string& name) {
  static const std::pair<const char*, Part> suffixes[] = {
      {".lora_A.weight", Part::Down},         {".lora_B.weight", Part::Up},
      {".lora_down.weight", Part::Down},      {".lora_up.weight", Part::Up},
      {".lora_A.default.weight", Part::Down}, {".lora_B.default.weight", Part::Up},
      {".alpha", Part::Alpha},
  };
  for (const auto& [suffix, part] : suffixes)
    if (name.ends_with(suffix)) return Key{name.substr(0, name.size() - strlen(suffix)), part};
  return std::nullopt;
}

struct Module {
  const SafetensorsEntry* down = nullptr;
  const SafetensorsEntry* up = nullptr;
  const SafetensorsEntry* alpha = nullptr;
};

Tensor read_f32(const SafetensorsFile& file, const SafetensorsEntry& e) {
  check(dtype_is_float(e.dtype), file.path().string(), ": LoRA tensor ", e.name, " is ",
        dtype_name(e.dtype), ", expected F32, F16 or BF16");
  Tensor t(e.shape);
  to_f32(e.dtype, file.view(e).data, t.data(), size_t(t.numel()));
  return t;
}

// Rows [begin, end) of a [rows, r] matrix, the halves swapped when asked.
Tensor take_rows(const Tensor& up, int64_t begin, int64_t end, bool swap_halves) {
  const int64_t r = up.dim(1), n = end - begin;
  Tensor out({n, r});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t src = swap_halves ? begin + (i + n / 2) % n : begin + i;
    std::memcpy(out.row(i), up.row(src), size_t(r) * sizeof(float));
  }
  return out;
}

bool all_finite(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.data()[i])) return false;
  return true;
}

Tensor copy(const Tensor& t) {
  Tensor c(t.shape());
  std::memcpy(c.data(), t.data(), size_t(t.numel()) * sizeof(float));
  return c;
}

}  // namespace

LoraFile parse_lora_argument(const std::string& text) {
  LoraFile f{text, 1.0f};
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos && colon + 1 < text.size()) {
    const std::string tail = text.substr(colon + 1);
    float v = 0;
    const auto [end, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), v);
    if (ec == std::errc() && end == tail.data() + tail.size()) {
      check(std::isfinite(v), "--lora ", text, ": the scale after ':' must be a finite number");
      f = LoraFile{text.substr(0, colon), v};
    }
  }
  check(!f.path.empty(), "--lora ", text, ": expected FILE or FILE:SCALE");
  return f;
}

std::string lora_label(const LoraFile& f) {
  std::ostringstream s;
  s << f.path.stem().string() << ":" << f.scale;
  return s.str();
}

Adapters Adapters::load(std::span<const LoraFile> files, const ModelConfig& config) {
  const ModelFamily& family = model_family(config);
  const ShapeMap expected = family.expected_transformer(config);
  Adapters out;
  for (const LoraFile& lf : files) {
    check(std::filesystem::exists(lf.path), "--lora ", lf.path.string(), ": no such file");
    const SafetensorsFile file(lf.path);
    const std::string where = lf.path.string();
    std::map<std::string, Module> modules;  // sorted: the order of updates is stable
    for (const SafetensorsEntry& e : file.entries()) {
      const auto key = split_key(e.name);
      if (!key) {
        fail(where, ": tensor ", e.name, " is not a LoRA A, B or alpha tensor (DoRA "
             "magnitudes, biases and full weight differences are not supported)");
      }
      const std::string& m = key->module;
      if (m.starts_with("lora_te") || m.find("text_encoder") != std::string::npos)
        fail(where, ": tensor ", e.name, " adapts the text encoder; only transformer LoRAs "
             "are supported");
      Module& mod = modules[m];
      const SafetensorsEntry*& slot =
          key->part == Part::Down ? mod.down : key->part == Part::Up ? mod.up : mod.alpha;
      check(slot == nullptr, where, ": tensor ", e.name, " repeats module ", key->module,
            " (two spellings of the same part)");
      slot = &e;
    }
    check(!modules.empty(), where, ": no LoRA tensors");

    std::map<std::pair<std::string, int64_t>, std::string> changed;  // (weight, row): module
    for (const auto& [name, mod] : modules) {
      check(mod.down || mod.up, where, ": module ", name, " has an alpha but no A or B");
      check(mod.down && mod.up, where, ": module ", name, " has ", mod.down ? "A" : "B",
            " (lora_", mod.down ? "A/down" : "B/up", ") but no ", mod.down ? "B" : "A");
      const Shape& a = mod.down->shape;
      const Shape& b = mod.up->shape;
      check(a.size() == 2 && b.size() == 2 && a[0] > 0 && a[0] == b[1], where, ": module ",
            name, ": A is ", shape_str(a), " and B ", shape_str(b), ", expected [r, in] and "
            "[out, r] with the same rank r");
      const int64_t rank = a[0];
      float scale = lf.scale;
      if (mod.alpha) {
        check(numel(mod.alpha->shape) == 1, where, ": ", mod.alpha->name, " is ",
              shape_str(mod.alpha->shape), ", expected one number");
        const float alpha = read_f32(file, *mod.alpha).data()[0];
        check(std::isfinite(alpha), where, ": ", mod.alpha->name, " is not finite");
        scale *= alpha / float(rank);
      }
      const std::vector<TensorSource> targets = family.lora_targets(name, b, where);
      check(!targets.empty(), where, ": module ", name, " is not a ", family.title(),
            " transformer module");
      const Tensor down = read_f32(file, *mod.down);
      const Tensor up = read_f32(file, *mod.up);
      check(all_finite(down) && all_finite(up), where, ": module ", name,
            " holds NaN or Inf values");
      for (const TensorSource& src : targets) {
        auto it = expected.find(src.canonical);
        check(it != expected.end() && it->second.size() == 2, where, ": module ", name,
              " changes ", src.canonical, ", which is not a linear weight of this ",
              family.title(), " transformer");
        const Shape target = it->second;
        const int64_t begin = src.row_end < 0 ? 0 : src.row_begin;
        const int64_t end = src.row_end < 0 ? b[0] : src.row_end;
        check(a[1] == target[1] && end - begin == target[0], where, ": module ", name,
              " is a [", end - begin, ", ", a[1], "] update (rank ", rank, "), but ",
              src.canonical, " is ", shape_str(target),
              ": this LoRA was made for another model");
        const auto [seen, fresh] = changed.emplace(std::pair{src.canonical, begin}, name);
        check(fresh, where, ": modules ", seen->second, " and ", name, " both change ",
              src.canonical, " (two spellings of the same module)");
        LoraUpdate u;
        u.target = src.canonical;
        u.down = copy(down);
        u.up = take_rows(up, begin, end, src.swap_halves);
        u.scale = scale;
        out.updates_[u.target].push_back(std::move(u));
      }
    }
  }
  return out;
}

std::span<const LoraUpdate> Adapters::on(const std::string& target) const {
  auto it = updates_.find(target);
  if (it == updates_.end()) return {};
  return it->second;
}

size_t Adapters::bytes() const {
  size_t n = 0;
  for (const auto& [_, list] : updates_)
    for (const LoraUpdate& u : list) n += size_t(u.down.numel() + u.up.numel()) * sizeof(float);
  return n;
}

}  // namespace klein
