// Reading a tiny autoencoder's half from a .pth or .safetensors file, and checking it against
// the layout of taesd.py (taesd.h) as each half's layers take their tensors.
#include <array>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/pth.h"
#include "formats/safetensors.h"
#include "models/taesd/layers.h"

namespace klein::taesd {

namespace fs = std::filesystem;

namespace {

struct Source {
  std::string name;
  TensorView view;
};

// The tensor that tells the half apart: the decoder's first conv is layer 1 (layer 0 is the
// Clamp), the encoder's is layer 0.
const char* marker(Half half) { return half == Half::Decoder ? "1.weight" : "0.weight"; }
const char* half_name(Half half) { return half == Half::Decoder ? "decoder" : "encoder"; }

template <class File>
std::vector<Source> sources_of(const File& file) {
  std::vector<Source> out;
  for (const auto& e : file.entries()) out.push_back({e.name, file.view(e)});
  return out;
}

}  // namespace

std::string describe_latent_width(int64_t latent_channels) {
  switch (latent_channels) {
    case kTaef2LatentChannels: return "32 latent channels: TAEF2, for the FLUX.2 VAE";
    case kTaef1LatentChannels: return "16 latent channels: TAEF1, for the FLUX.1 VAE (Z-Image)";
    case 4: return "4 latent channels: TAESD, for Stable Diffusion's VAE";
    default: return std::to_string(latent_channels) + " latent channels";
  }
}

TinyWeights read_tiny_weights(const fs::path& path, Half half) {
  const std::string where = path.string();
  check(fs::is_regular_file(path), where, ": no such file (a tiny autoencoder's ", half_name(half),
        ", .pth or .safetensors)");
  // The file stays mapped while its tensors are converted.
  std::unique_ptr<PthFile> pth;
  std::unique_ptr<SafetensorsFile> safetensors;
  std::vector<Source> all;
  if (looks_like_zip(path)) {
    pth = std::make_unique<PthFile>(path);
    all = sources_of(*pth);
  } else {
    safetensors = std::make_unique<SafetensorsFile>(path);
    all = sources_of(*safetensors);
  }
  auto has = [&](const std::string& name) {
    for (const Source& s : all)
      if (s.name == name) return true;
    return false;
  };
  const std::string own = half == Half::Decoder ? "decoder." : "encoder.";
  const std::array<std::string, 3> prefixes = {"", "taesd_" + own, own};
  const std::string* prefix = nullptr;
  for (const std::string& p : prefixes)
    if (has(p + marker(half))) {
      prefix = &p;
      break;
    }
  if (prefix == nullptr) {
    const Half other = half == Half::Decoder ? Half::Encoder : Half::Decoder;
    const bool is_other =
        has(marker(other)) || has("taesd_" + std::string(half_name(other)) + "." + marker(other));
    fail(where, ": no tensor ", marker(half), " (bare or under taesd_", own,
         "): not a tiny autoencoder's ", half_name(half), " in taesd.py's layout",
         is_other ? std::string(" (it looks like the ") + half_name(other) + ")" : "");
  }
  TinyWeights w;
  w.path = path;
  for (const Source& s : all) {
    if (!s.name.starts_with(*prefix)) continue;
    if (prefix->empty() && (s.name == "vae_scale" || s.name == "vae_shift")) continue;
    check(dtype_is_float(s.view.dtype), where, ": tensor ", s.name, " is ",
          dtype_name(s.view.dtype), ", expected F32, F16 or BF16");
    std::vector<float> values(size_t(s.view.numel()));
    to_f32(s.view.dtype, s.view.data, values.data(), values.size());
    w.tensors[s.name.substr(prefix->size())] = {s.view.shape, std::move(values)};
  }
  return w;
}

// ---- Taking the layers' tensors, checked against taesd.py's shapes.

Layers::Layers(TinyWeights weights) : w_(std::move(weights)), where_(w_.path.string()) {}

std::vector<float> Layers::take(const std::string& name, const Shape& shape) {
  auto it = w_.tensors.find(name);
  check(it != w_.tensors.end(), where_, ": tensor ", name, " is missing (", shape_str(shape),
        " in taesd.py's layout)");
  check(it->second.first == shape, where_, ": tensor ", name, " is ", shape_str(it->second.first),
        ", expected ", shape_str(shape));
  std::vector<float> values = std::move(it->second.second);
  w_.tensors.erase(it);
  return values;
}

const Shape* Layers::shape_of(const std::string& name) const {
  auto it = w_.tensors.find(name);
  return it == w_.tensors.end() ? nullptr : &it->second.first;
}

bool Layers::has(const std::string& name) const { return w_.tensors.count(name) > 0; }

void Layers::conv(const std::string& name, int64_t out, int64_t in, int64_t kernel, bool bias) {
  ops::Conv2dWeights c;
  c.out_channels = out;
  c.in_channels = in;
  c.kernel = kernel;
  c.weight = take(name + ".weight", {out, in, kernel, kernel});
  if (bias) c.bias = take(name + ".bias", {out});
  convs[name] = std::move(c);
}

void Layers::block(const std::string& name, bool pool) {
  if (pool) {
    conv(name + ".pool.0", kPoolChannels, kChannels, 1, false);
    norms[name + ".pool.1.weight"] = take(name + ".pool.1.weight", {kPoolChannels});
    norms[name + ".pool.1.bias"] = take(name + ".pool.1.bias", {kPoolChannels});
    conv(name + ".pool.3", kChannels, kPoolChannels, 1, false);
  }
  for (const char* i : {".conv.0", ".conv.2", ".conv.4"})
    conv(name + i, kChannels, kChannels, 3, true);
}

void Layers::finish() {
  check(w_.tensors.empty(), where_, ": tensor ",
        w_.tensors.empty() ? "" : w_.tensors.begin()->first, " is not part of taesd.py's layout (",
        w_.tensors.size(), " such; another variant of the network?)");
}

}  // namespace klein::taesd
