#include "pipeline/tiny_decoder.h"

#include <algorithm>

#include "core/error.h"
#include "core/json_fields.h"
#include "formats/image/preprocess.h"
#include "models/taesd/taesd.h"
#include "pipeline/pipeline.h"
#include "pipeline/stages.h"
#include "weights/config.h"
#include "weights/component_store.h"
#include "weights/weight_store.h"

namespace klein {

namespace {

namespace fs = std::filesystem;

// The decoder's file: `path` itself, or the first of taesd's names in a directory.
fs::path tiny_decoder_file(const fs::path& path, const std::string& option) {
  check(!path.empty(), option, ": no file given");
  if (fs::is_directory(path)) {
    for (const char* name : {"taef2_decoder.pth", "taef1_decoder.pth", "taef2_decoder.safetensors",
                             "taef1_decoder.safetensors"})
      if (fs::is_regular_file(path / name)) return path / name;
    fail(option, " ", path.string(), ": no tiny decoder in this directory (expected "
         "taef2_decoder.pth, taef1_decoder.pth, or the same names with .safetensors)");
  }
  check(fs::is_regular_file(path), option, " ", path.string(),
        ": no such file (a tiny autoencoder's decoder: taef2_decoder.pth for FLUX.2, "
        "taef1_decoder.pth for Z-Image, or a .safetensors copy)");
  return path;
}

}  // namespace

std::shared_ptr<const taesd::TinyDecoder> open_shared_tiny_decoder(const fs::path& path,
                                                                   const std::string& option) {
  return std::make_shared<const taesd::TinyDecoder>(tiny_decoder_file(path, option));
}

ExtraComponent tiny_vae_component(const fs::path& path, const std::string& option,
                                  const ModelConfig& config) {
  const fs::path file = tiny_decoder_file(path, option);
  taesd::TinyWeights weights = taesd::read_tiny_weights(file, taesd::Half::Decoder);
  // Checked as a generation would take it: taesd.py's layout and this model's latent width.
  const taesd::TinyDecoder checked(weights, config.vae.latent_channels,
                                   "storing it beside this model (" + config.family + ")");
  ExtraComponent e;
  e.key = "tiny_vae";
  e.title = "the tiny decoder";
  e.store = std::make_shared<ComponentStore>(
      std::move(weights.tensors), std::string(kTinyVaeDecoderUnit) + ".", tiny_vae_unit_of,
      std::vector<fs::path>{file}, file.string(), "the tiny decoder " + file.string());
  e.metadata = {{"source", file.filename().string()},
                {"latent_channels", checked.latent_channels()},
                {"summary", taesd::describe_latent_width(checked.latent_channels())}};
  return e;
}

std::shared_ptr<const taesd::TinyDecoder> stored_tiny_decoder(WeightStore& weights) {
  const StoreOrigin origin = weights.origin();
  if (!origin.container_metadata || !origin.container_metadata->contains("tiny_vae")) return nullptr;
  const std::string container = origin.files.empty() ? "the container" : origin.files[0].string();
  check(weights.has_unit(kTinyVaeDecoderUnit), container, ": the metadata names a tiny decoder "
        "but unit ", kTinyVaeDecoderUnit, " is missing");
  taesd::TinyWeights w;
  // The container's path with the source's name after it ("model.klein/taef2_decoder.pth"):
  // messages name both, the image metadata the source.
  const nlohmann::json& meta = (*origin.container_metadata)["tiny_vae"];
  check(meta.is_object(), container, ": metadata \"tiny_vae\": expected an object, found ",
        meta.type_name());
  std::string source = "tiny_vae";
  read_json_field(meta, "source", source, container + ": metadata \"tiny_vae\"");
  w.path = fs::path(container) / source;
  {
    const UnitRef unit = weights.acquire(kTinyVaeDecoderUnit);
    for (const Weight& t : unit->weights())
      w.tensors[t.name.substr(unit->prefix().size())] = {t.shape, weight_to_floats(t)};
  }
  weights.release(kTinyVaeDecoderUnit);
  return std::make_shared<const taesd::TinyDecoder>(std::move(w), weights.config().vae.latent_channels,
                                                    "this model");
}

void check_tiny_decoder(const TinyDecoderOptions& tiny, const ModelConfig& config) {
  check(!tiny.decode || tiny.on(),
        "--decoder tiny: no tiny decoder (--tiny-vae FILE: taef2_decoder.pth for FLUX.2, "
        "taef1_decoder.pth for Z-Image; or a container that holds one: klein convert "
        "--tiny-vae)");
  check(tiny.preview_size >= 8 && tiny.preview_size <= 8192,
        "preview size: expected 8 to 8192 pixels on the long side, got ", tiny.preview_size);
  if (!tiny.on()) return;
  const int64_t width = tiny.model->latent_channels(), expected = config.vae.latent_channels;
  check(width == expected, tiny.model->path().string(), ": a tiny autoencoder of ",
        taesd::describe_latent_width(width), "; the latents of this model (", config.family,
        ") need one of ",
        taesd::describe_latent_width(expected));
}

Tensor pool_latents_for_preview(const Tensor& latents, int64_t pixels) {
  check(latents.shape().size() == 3, "preview: latents [C, h, w] expected, got ",
        shape_str(latents.shape()));
  const int64_t c = latents.dim(0), h = latents.dim(1), w = latents.dim(2);
  const int64_t cells = std::max<int64_t>(1, pixels / 8);
  const int64_t k = std::max<int64_t>(1, (std::max(h, w) + cells - 1) / cells);
  if (k == 1) return latents.copy();
  const int64_t ph = std::max<int64_t>(1, h / k), pw = std::max<int64_t>(1, w / k);
  const int64_t kh = std::min(k, h), kw = std::min(k, w);
  Tensor out({c, ph, pw});
  const float scale = 1.0f / float(kh * kw);
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t y = 0; y < ph; ++y)
      for (int64_t x = 0; x < pw; ++x) {
        float sum = 0;
        for (int64_t dy = 0; dy < kh; ++dy) {
          const float* row = latents.data() + (ch * h + y * kh + dy) * w + x * kw;
          for (int64_t dx = 0; dx < kw; ++dx) sum += row[dx];
        }
        out.data()[(ch * ph + y) * pw + x] = sum * scale;
      }
  return out;
}

void tiny_output_to_signed(Tensor& image) {
  float* p = image.data();
  for (int64_t i = 0; i < image.numel(); ++i) p[i] = p[i] * 2.0f - 1.0f;
}

Image tiny_step_preview(const FamilyStages& stages, WeightStore& store, Compute& cx,
                        const TinyDecoderOptions& tiny, const StepView& step) {
  check(tiny.on(), "tiny preview: no tiny decoder");
  const Tensor& in = step.latents_in;
  const Tensor& v = step.velocity;
  check(in.shape() == v.shape(), "tiny preview: latents ", shape_str(in.shape()),
        " and velocity ", shape_str(v.shape()), " differ");
  Tensor x0(in.shape());
  for (int64_t i = 0; i < in.numel(); ++i) x0.data()[i] = in.data()[i] - step.sigma * v.data()[i];
  const Tensor z = pool_latents_for_preview(
      stages.tiny_decoder_input(store, x0, step.grid, cx), tiny.preview_size);
  Tensor image = tiny.model->decode(z, cx);
  tiny_output_to_signed(image);
  return tensor_to_image(image);
}

}  // namespace klein
