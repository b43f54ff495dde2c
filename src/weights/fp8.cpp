#include "weights/fp8.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace klein {

namespace {


// What a tensor name says it is beside the weights, or "" for a weight.
enum class Role { Weight, Scale, InputScale, Marker, LayerConfig };

Role role_of(const std::string& name, std::string& layer) {
  struct Suffix {
    const char* text;
    Role role;
  };
  static const Suffix suffixes[] = {
      {".scale_weight", Role::Scale},      {".weight_scale", Role::Scale},
      {".scale_input", Role::InputScale},  {".input_scale", Role::InputScale},
      {".comfy_quant", Role::LayerConfig},
  };
  for (const auto& s : suffixes)
    if (name.ends_with(s.text)) {
      layer = name.substr(0, name.size() - std::string(s.text).size());
      return s.role;
    }
  if (name == "scaled_fp8" || name.ends_with(".scaled_fp8")) return Role::Marker;
  return Role::Weight;
}

float value_at(const TensorView& v, size_t i) {
  float f = 0;
  to_f32(v.dtype, static_cast<const std::byte*>(v.data) + i * dtype_size(v.dtype), &f, 1);
  return f;
}

}  // namespace

Fp8Tensors find_fp8_tensors(const SafetensorsSet& files, const std::string& where) {
  Fp8Tensors out;
  bool marked = false;
  std::string marker;
  for (const auto& t : files.tensors()) {
    const SafetensorsEntry& e = *t.entry;
    std::string layer;
    const Role role = role_of(e.name, layer);
    if (role == Role::Weight) continue;
    out.companions.push_back(e.name);
    const TensorView view = t.file->view(e);
    switch (role) {
      case Role::Marker:
        marked = true;
        marker = e.name;
        break;
      case Role::LayerConfig: {
        // ComfyUI's per-layer quantization record: the bytes of a JSON object.
        check(e.dtype == DType::U8 && e.shape.size() == 1, where, ": tensor ", e.name,
              " should hold the bytes of a JSON object (U8, one dimension), got ",
              dtype_name(e.dtype), " ", shape_str(e.shape));
        const auto* text = static_cast<const char*>(view.data);
        const nlohmann::json conf = nlohmann::json::parse(text, text + view.nbytes, nullptr, false);
        check(conf.is_object(), where, ": tensor ", e.name, " is not a JSON object");
        const std::string format = conf.value("format", std::string());
        check(format == "float8_e4m3fn" || format == "float8_e5m2", where, ": layer ", layer,
              " is quantized as \"", format, "\" (", e.name, "); only the fp8 formats "
              "float8_e4m3fn and float8_e5m2 are read");
        break;
      }
      case Role::InputScale:
        // Scales the activations on fp8 hardware; the weight's value does not depend on it.
        check(dtype_is_float(e.dtype) && numel(e.shape) == 1, where, ": tensor ", e.name,
              " should be one float (an input scale), got ", dtype_name(e.dtype), " ",
              shape_str(e.shape));
        break;
      case Role::Scale: {
        const std::string weight = layer + ".weight";
        const auto* w = files.find(weight);
        check(w != nullptr, where, ": tensor ", e.name, " is the scale of ", weight,
              ", which the file does not hold");
        check(dtype_is_fp8(w->entry->dtype), where, ": tensor ", weight, " is of type ",
              dtype_name(w->entry->dtype), " but has a scale (", e.name,
              "); only fp8 weights (F8_E4M3, F8_E5M2) with scales are read");
        check(dtype_is_float(e.dtype), where, ": scale ", e.name, " is of type ",
              dtype_name(e.dtype), "; expected F32, BF16 or F16");
        const Shape& ws = w->entry->shape;
        const int64_t rows = ws.empty() ? 1 : ws[0];
        const int64_t n = numel(e.shape);
        const bool per_tensor = n == 1 && e.shape.size() <= 2;
        const bool per_row = !ws.empty() && n == rows &&
                             (e.shape.size() == 1 || (e.shape.size() == 2 && e.shape[1] == 1));
        check(per_tensor || per_row, where, ": scale ", e.name, " has shape ", shape_str(e.shape),
              "; expected [] or [1] (one scale) or [", rows, "] or [", rows, ", 1] (one per row) "
              "for weight ", weight, " ", shape_str(ws));
        for (int64_t i = 0; i < n; ++i) {
          const float s = value_at(view, size_t(i));
          check(std::isfinite(s), where, ": scale ", e.name, " holds ", s, " at ", i,
                "; the checkpoint is damaged");
        }
        const auto [at, added] = out.scale_of.emplace(weight, e.name);
        check(added, where, ": weight ", weight, " has two scales (", at->second, " and ",
              e.name, ")");
        break;
      }
      case Role::Weight: break;
    }
  }
  if (marked)
    for (const auto& t : files.tensors()) {
      const SafetensorsEntry& e = *t.entry;
      if (!dtype_is_fp8(e.dtype) || e.name == marker) continue;
      check(out.scale_of.count(e.name), where, ": the file is marked as scaled fp8 (", marker,
            ") but fp8 tensor ", e.name, " has no scale (expected ",
            e.name.substr(0, e.name.rfind('.')), ".scale_weight)");
    }
  return out;
}

std::vector<float> fp8_scale_values(const TensorView& scale) {
  std::vector<float> out(size_t(numel(scale.shape)));
  for (size_t i = 0; i < out.size(); ++i) out[i] = value_at(scale, i);
  return out;
}

void decode_fp8_rows(DType type, const std::byte* codes, int64_t r0, int64_t r1, int64_t cols,
                     const float* scale, int64_t scale_count, const std::string& name, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    float* row = out + size_t(r - r0) * size_t(cols);
    to_f32(type, codes + size_t(r) * size_t(cols), row, size_t(cols));
    if (scale) {
      const float s = scale[scale_count == 1 ? 0 : r];
      for (int64_t c = 0; c < cols; ++c) row[c] *= s;
    }
    for (int64_t c = 0; c < cols; ++c)
      if (!std::isfinite(row[c]))
        fail("tensor ", name, " holds ", row[c], " (row ", r, ", column ", c,
             "): the checkpoint is damaged; it would make a flat or noisy image");
  }
}

}  // namespace klein
