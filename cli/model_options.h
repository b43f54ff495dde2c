#pragma once
// The options that say where the model is. Every subcommand that loads a model adds them
// through add_model_options, so they are spelled, documented and checked the same way
// everywhere:
//   -m, --model DIR|FILE     the diffusers directory of FLUX.2-klein (or a klein container)
//   --diffusion-model FILE   transformer safetensors (BFL, ComfyUI or diffusers names)
//   --text-encoder FILE      Qwen3 safetensors, or the .index.json of a sharded one
//   --vae FILE               VAE safetensors (BFL or diffusers names)
//   --tokenizer DIR          vocab.json + merges.txt (+ tokenizer_config.json), or tokenizer.json
// Single files override the matching part of -m, or stand alone without it.
#include <CLI/CLI.hpp>

#include "pipeline/pipeline.h"
#include "weights/model_source.h"

namespace klein::cli {

// Adds the options to `cmd`; parsed values land in `paths`, which must outlive the parse
// (keep it in the subcommand's options struct, captured by its callback).
void add_model_options(CLI::App& cmd, ModelPaths& paths);

// --precision auto|exact|fast (pipeline.h Precision), the same for generate and report.
void add_precision_option(CLI::App& cmd, Precision& precision);

}  // namespace klein::cli
