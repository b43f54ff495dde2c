#include "cli/model_options.h"

#include <map>

#include "weights/family.h"

namespace klein::cli {

void add_model_options(CLI::App& cmd, ModelPaths& paths) {
  const char* group = "Model";
  cmd.add_option("-m,--model", paths.model,
                 "diffusers directory (model_index.json, transformer/, text_encoder/, vae/, "
                 "tokenizer/) of " +
                     family_titles() + ", or klein container file")
      ->group(group);
  cmd.add_option("--diffusion-model", paths.diffusion_model,
                 "transformer safetensors file (BFL, ComfyUI or diffusers names) or GGUF file "
                 "(ComfyUI-GGUF, stable-diffusion.cpp); overrides the one in -m")
      ->group(group);
  cmd.add_option("--text-encoder", paths.text_encoder,
                 "Qwen3 text encoder safetensors file or its .index.json, or a llama.cpp GGUF "
                 "(its tokenizer, when it carries one, is used unless --tokenizer is given); "
                 "overrides the one in -m")
      ->group(group);
  cmd.add_option("--vae", paths.vae,
                 "VAE safetensors file (BFL or diffusers names); overrides the one in -m")
      ->group(group);
  std::string variants;
  for (const ModelFamily* f : model_families())
    variants += (variants.empty() ? "" : "; ") + f->variants_help();
  cmd.add_option("--variant", paths.variant,
                 "which model a checkpoint is where its files do not say (" + variants +
                     "); must agree where the checkpoint says")
      ->group(group);
  cmd.add_option("--tokenizer", paths.tokenizer,
                 "tokenizer directory (vocab.json + merges.txt + tokenizer_config.json, or "
                 "tokenizer.json); overrides every other: a container's, a GGUF text "
                 "encoder's and the tokenizer/ of -m")
      ->group(group);
}

void add_precision_option(CLI::App& cmd, Precision& precision) {
  cmd.add_option("--precision", precision,
                 "exact: float32 activations throughout; fast: bf16 tiles for the transformer and "
                 "the VAE on CPUs with AMX, elsewhere float32 Winograd VAE convolutions (and "
                 "bf16 attention on AMD's AVX-512 BF16 CPUs; the transformer exact on the "
                 "others); auto: fast for Q8/Q4 containers, else exact")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, Precision>{
              {"auto", Precision::Auto}, {"exact", Precision::Exact}, {"fast", Precision::Fast}},
          CLI::ignore_case));
}

}  // namespace klein::cli
