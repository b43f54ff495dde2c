// Z-Image's decode path against ../shared/testdata/zimage-tiny (vectors/vae): the pipeline's
// latents scaled into the decoder's input, and the FLUX.1 16-channel VAE decoder (the engine's
// VAE decoder with this VAE's config: no quant convs, 16 latent channels) with every
// intermediate of the first size, within 1e-4 scaled.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "core/files.h"
#include "core/npy.h"
#include "models/vae/decoder.h"
#include "models/zimage/latents.h"
#include "support/testing.h"
#include "weights/config.h"
#include "zimage/file_store.h"

namespace klein::zimage {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using testing::zimage_dir;

// [C, H, W] from a [1, C, H, W] .npy.
Tensor chw(const fs::path& path) {
  const NpyArray a = read_npy(path);
  Tensor t = a.to_tensor();
  t.reshape({a.shape[1], a.shape[2], a.shape[3]});
  return t;
}

TEST(ZImageVae, DecodesTheOfficialLatents) {
  const fs::path dir = zimage_dir() / "model" / "vae";
  const json config_json = json::parse(read_text_file(dir / "config.json"));
  ModelConfig config;
  config.vae = parse_vae_config(config_json, "vae/config.json");
  EXPECT_EQ(config.vae.latent_channels, 16);
  EXPECT_FALSE(config.vae.use_post_quant_conv);
  const LatentScale scale = parse_latent_scale(config_json, "vae/config.json");
  EXPECT_EQ(scale.scaling, 0.3611f);
  EXPECT_EQ(scale.shift, 0.1159f);
  testing::ComponentFileStore store(dir / "diffusion_pytorch_model.safetensors", "vae", unit_of,
                                    config);
  Compute cx(2);
  const UnitRef decoder = store.acquire("vae.decoder");
  for (const char* size : {"h64_w96", "h80_w64"}) {
    SCOPED_TRACE(size);
    const fs::path v = zimage_dir() / "vectors" / "vae";
    const std::string stem = std::string("decode_") + size + "_";
    const Tensor z = decoder_input(chw(v / (stem + "latents.npy")), scale);
    EXPECT_TRUE(testing::matches_npy(z, v / (stem + "vae_input.npy"), 1e-6));
    int intermediates = 0;
    const Tensor image = vae::run_decoder(*decoder, config.vae, z, cx,
                                          [&](const std::string& name, const Tensor& t) {
                                            const fs::path ref = v / (stem + name + ".npy");
                                            if (!fs::exists(ref)) return;
                                            EXPECT_TRUE(testing::matches_npy(t, ref, 1e-4)) << name;
                                            ++intermediates;
                                          });
    EXPECT_EQ(intermediates, std::string(size) == "h64_w96" ? 7 : 0);
    EXPECT_TRUE(testing::matches_npy(image, v / (stem + "image.npy"), 1e-4));
  }
}

TEST(ZImageVae, LatentScaleNeedsBothFactors) {
  EXPECT_NE(testing::error_of([] {
              parse_latent_scale(json{{"scaling_factor", 0.3611}}, "c.json");
            }).find("shift_factor"),
            std::string::npos);
}

}  // namespace
}  // namespace klein::zimage
