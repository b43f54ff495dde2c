#pragma once
// The Z-Image ControlNet forward (diffusers ZImageControlNetModel, Union 2.1 structure), which
// runs beside the transformer at every forward and adds its hints to the transformer's stream.
// It shares the transformer's embedders, noise refiner, caption rows and pad token, and runs
// the transformer's block on streams of its own (transformer.h: Transformer::block).
//
//   per generation   control context [Cin, H, W] (the control image's latents, zero channels
//                    or the inpainting mode's mask and masked latents up to Cin) → patch
//                    tokens (as the latents, pad rows repeating the last) →
//                    control_all_x_embedder → pad rows = x_pad_token: ctx [Nx, D], and
//                    before_proj_r0(ctx), which does not change with the step
//   per forward      x = the latents embedded as the transformer embeds them (pad token
//                    included), rows [0, Nx)
//     refiner stage  c = before_proj_r0(ctx) + x; for each control refiner block j:
//                    c = block_j(c) (image rows, modulated, image RoPE);
//                    hint_rj = after_proj_rj(c) · scale
//                    the control model's own pass of x through the transformer's noise
//                    refiner, hint_rj added after noise-refiner layer refiner_places[j]
//     layer stage    u = [x | caption rows] (the transformer's refined caption);
//                    c = before_proj_l0([c | caption rows]) + u; for each control layer j:
//                    c = block_j(c) (all rows, unified RoPE); hint_j = after_proj_j(c) · scale,
//                    added to the transformer's stream after main layer layer_places[j]
// The control layers run when the transformer's forward reaches their place (add_hints), so
// that one hint is held at a time, not all of them.
#include <cstdint>

#include "core/tensor.h"
#include "models/zimage/checkpoint/controlnet.h"
#include "models/zimage/transformer.h"

namespace klein::zimage {

// The control model's streams for one sequence (the prompt's, or the negative prompt's).
struct ControlActivations {
  ControlActivations(const TransformerConfig& base, const SequenceLayout& layout);
  // What the constructor allocates for this layout, for memory plans before a run.
  static size_t plan_bytes(const TransformerConfig& base, const SequenceLayout& layout);

  Tensor context;  // [Nx, D] before_proj_r0 of the embedded control context (per generation)
  Tensor x;        // [S, D] the control model's pass of the image rows, then u; a hint after
  Tensor c;        // [S, D] the control stream
  Tensor scratch;  // [S, D] a projection of c before it is added, a refiner hint
  // The forward in flight: its modulation input (the caller's, alive during the forward),
  // scale, and the next control layer to run.
  const Tensor* adaln = nullptr;
  float scale = 1;
  size_t next_layer = 0;
};

class ControlNet {
 public:
  // `store` holds the control model's units (checkpoint/controlnet.h); the transformer's are
  // read from the transformer's store.
  ControlNet(WeightStore& store, const ControlNetConfig& config, Transformer& base);

  const ControlNetConfig& config() const { return config_; }

  // The control context [in_channels, H, W] (H, W the latent grid of `a`'s layout) embedded
  // into ca.context.
  void embed_control(const Tensor& control, ControlActivations& ca, Activations& a, Compute& cx);
  // Before the transformer's forward on the same latents, modulation and `a` (after its
  // embed_caption): the refiner stage and the control model's pass of x, and the layer stage's
  // start. `scale` is the pipeline's controlnet_conditioning_scale.
  void start_forward(const Tensor& latents, const Tensor& adaln, float scale,
                     ControlActivations& ca, Activations& a, Compute& cx,
                     const Observer& observe = {});
  // After main layer `layer` of that forward: when a control layer is placed there, runs it
  // and adds its hint to `stream` ([S, D], the transformer's). Reports "controlnet_hint_{layer}".
  void add_hints(int64_t layer, float* stream, ControlActivations& ca, Activations& a,
                 Compute& cx, const Observer& observe = {});

 private:
  // c = before_proj(c) + x over `rows` rows (the unit's block 0).
  void before_proj(const WeightUnit& w, const float* x, int64_t rows, ControlActivations& ca,
                   Compute& cx);
  // hint = after_proj(c) · scale into `out`, over `rows` rows.
  void hint(const WeightUnit& w, int64_t rows, float scale, const ControlActivations& ca,
            float* out, Compute& cx);

  WeightStore& store_;
  ControlNetConfig config_;
  Transformer& base_;
};

}  // namespace klein::zimage
