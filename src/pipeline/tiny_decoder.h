#pragma once
// The tiny autoencoder in a generation (models/taesd: TAEF2 stands in for FLUX.2's VAE, TAEF1
// for the FLUX.1 VAE of Z-Image), opened once by the front end and shared by its generations
// (GenerateOptions::tiny):
//   - previews: each step's clean estimate x0 = x_in − σ·v, in the family's latent layout,
//     becomes the tiny decoder's input (FamilyStages::tiny_decoder_input), is averaged down to
//     at most `preview_size` pixels on the long side (whole latent cells, a k x k mean), and
//     is decoded: a picture of the image forming rather than the colour fit of preview.h;
//   - decoding (`decode`): the final latents through the tiny decoder instead of the model's
//     VAE (Session::decode), about a seventeenth of the full decoder's work.
// The tiny decoder's output is in [0, 1]; the pipeline's decoded tensor is in [-1, 1], as the
// VAE's (2y − 1), so the 8-bit conversion, the safety check and the mark are the same after it.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "formats/image/image.h"
#include "ops/compute.h"
#include "weights/extra_component.h"

namespace klein {

namespace taesd {
class TinyDecoder;
}
class FamilyStages;
class WeightStore;
struct ModelConfig;
struct StepView;

struct TinyDecoderOptions {
  std::shared_ptr<const taesd::TinyDecoder> model;  // null: previews by colour fit, VAE decode
  bool decode = false;        // decode the final latents with it (needs a model)
  int64_t preview_size = 256; // the longest side of a preview it makes, in pixels (8..8192)

  bool on() const { return model != nullptr; }
};

// Reads a tiny decoder (.pth or .safetensors: models/taesd) for TinyDecoderOptions::model;
// errors name the file. `option` names where the path came from ("--tiny-vae"). `path` is the
// decoder's file, or a directory holding one of taesd's names: taef2_decoder.pth,
// taef1_decoder.pth, or those names with .safetensors (ComfyUI's copies).
std::shared_ptr<const taesd::TinyDecoder> open_shared_tiny_decoder(
    const std::filesystem::path& path, const std::string& option);

// The tiny decoder (a file or directory as above) as a network to store beside a model
// (klein convert --tiny-vae): unit kTinyVaeDecoderUnit (weights/extra_component.h), float32
// (the policy keeps it exact), checked against taesd.py's layout and against `config`'s latent
// width before anything is written.
ExtraComponent tiny_vae_component(const std::filesystem::path& path, const std::string& option,
                                  const ModelConfig& config);

// The tiny decoder a container holds beside the model (convert --tiny-vae); null when it holds
// none. Generations without one of their own (GenerateOptions::tiny.model) use it.
std::shared_ptr<const taesd::TinyDecoder> stored_tiny_decoder(WeightStore& weights);

// Checks the options against the model before any work: `decode` needs a tiny decoder, whose
// latent width must be the model VAE's (TAEF2: 32, FLUX.2; TAEF1: 16, Z-Image), and the preview
// size is in range. Errors name the file and both widths.
void check_tiny_decoder(const TinyDecoderOptions& tiny, const ModelConfig& config);

// The tiny decoder's picture of one step's clean estimate, at most `preview_size` on the long
// side: StepView::preview when a tiny decoder is at hand.
Image tiny_step_preview(const FamilyStages& stages, WeightStore& store, Compute& cx,
                        const TinyDecoderOptions& tiny, const StepView& step);

// The latents as the tiny decoder takes them ([C, h, w]) averaged over k x k cells, k the
// smallest factor that brings 8·max(h, w) to at most `pixels` (k = 1: a copy). Cells past a
// multiple of k at the right and bottom edges are left out.
Tensor pool_latents_for_preview(const Tensor& latents, int64_t pixels);

// The tiny decoder's output [3, H, W] in [0, 1] mapped to [-1, 1] in place.
void tiny_output_to_signed(Tensor& image);

}  // namespace klein
