// libFuzzer target: the safetensors reader (header length, JSON header, dtypes, shapes,
// offsets) and every tensor view, and a LoRA file read against the tiny transformer's
// configuration (key mapping, shape checks). Every input must end in a parse or a
// klein::Error: never a crash, a hang or a huge allocation.
#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"
#include "families/registry.h"
#include "formats/safetensors.h"
#include "fuzz/fuzz_support.h"
#include "weights/lora.h"

// The LoRA readers below need the model families (klein_families): without them every input
// would end in the same refusal. Registered here, whatever the order of static initialisation.
static const bool families_registered = (klein::register_built_in_families(), true);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)families_registered;
  const auto path = klein::fuzz::as_file(data, size, ".safetensors");
  try {
    const klein::SafetensorsFile file(path);
    float sink = 0;
    for (const auto& e : file.entries()) {
      const klein::TensorView v = file.view(e);
      if (klein::dtype_is_float(v.dtype) && v.numel() > 0) {
        float first;
        klein::to_f32(v.dtype, v.data, &first, 1);
        sink += first;
      }
    }
    (void)sink;
  } catch (const klein::Error&) {
  }
  try {
    klein::ModelConfig tiny;  // klein-tiny's shapes: 2 heads, 2 + 2 blocks
    tiny.transformer.num_heads = 2;
    tiny.transformer.num_double_blocks = 2;
    tiny.transformer.num_single_blocks = 2;
    tiny.transformer.context_dim = 192;
    const klein::LoraFile lora{path, 0.5f};
    (void)klein::Adapters::load(std::span(&lora, 1), tiny);
  } catch (const klein::Error&) {
  }
  try {  // the same file as a LoRA of a tiny Z-Image transformer (its own module names)
    klein::ModelConfig tiny;
    tiny.family = "z-image";
    tiny.family_transformer = nlohmann::json::parse(
        R"({"all_patch_size": [2], "all_f_patch_size": [1], "in_channels": 16, "dim": 256,
            "n_layers": 2, "n_refiner_layers": 2, "n_heads": 2, "n_kv_heads": 2,
            "norm_eps": 1e-5, "qk_norm": true, "rope_theta": 256.0, "t_scale": 1000.0,
            "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512], "cap_feat_dim": 32})");
    const klein::LoraFile lora{path, 0.5f};
    (void)klein::Adapters::load(std::span(&lora, 1), tiny);
  } catch (const klein::Error&) {
  }
  return 0;
}
