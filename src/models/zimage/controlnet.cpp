// The Z-Image ControlNet forward (controlnet.h), float32 activations.
#include "models/zimage/controlnet.h"

#include <cstring>
#include <string>

#include "core/error.h"
#include "models/zimage/linear.h"
#include "models/zimage/checkpoint/units.h"

namespace klein::zimage {

ControlActivations::ControlActivations(const TransformerConfig& base, const SequenceLayout& l)
    : context({l.image_rows(), base.dim}),
      x({l.rows(), base.dim}),
      c({l.rows(), base.dim}),
      scratch({l.rows(), base.dim}) {}

size_t ControlActivations::plan_bytes(const TransformerConfig& base, const SequenceLayout& l) {
  return size_t(l.image_rows() + 3 * l.rows()) * size_t(base.dim) * sizeof(float);
}

ControlNet::ControlNet(WeightStore& store, const ControlNetConfig& config, Transformer& base)
    : store_(store), config_(config), base_(base) {}

void ControlNet::embed_control(const Tensor& control, ControlActivations& ca, Activations& a,
                               Compute& cx) {
  const SequenceLayout& l = a.layout;
  check(control.shape() == Shape{config_.in_channels, l.height, l.width},
        "Z-Image ControlNet: control context of shape ", shape_str(control.shape()), ", expected ",
        shape_str({config_.in_channels, l.height, l.width}));
  const TransformerConfig& b = base_.config();
  const std::string key = std::to_string(b.patch) + "-" + std::to_string(b.frame_patch);
  {
    UnitRef shared = store_.acquire("controlnet.shared");
    base_.embed_patches(control, *shared, "control_all_x_embedder." + key, ca.scratch.data(), a,
                        cx);
  }
  // The refiner stage's first projection, the same at every step.
  const int64_t D = config_.dim;
  UnitRef w = store_.acquire(control_refiner_unit(0));
  linear_bias(ca.scratch.data(), l.image_rows(), *w, "before_proj", D, D, ca.context.data(),
              nullptr, cx);
}

void ControlNet::before_proj(const WeightUnit& w, const float* x, int64_t rows,
                             ControlActivations& ca, Compute& cx) {
  const int64_t D = config_.dim;
  linear_bias(ca.c.data(), rows, w, "before_proj", D, D, ca.scratch.data(), nullptr, cx);
  float* c = ca.c.data();
  const float* p = ca.scratch.data();
  for (int64_t i = 0; i < rows * D; ++i) c[i] = p[i] + x[i];
}

void ControlNet::hint(const WeightUnit& w, int64_t rows, float scale, const ControlActivations& ca,
                      float* out, Compute& cx) {
  const int64_t D = config_.dim;
  linear_bias(ca.c.data(), rows, w, "after_proj", D, D, out, nullptr, cx);
  for (int64_t i = 0; i < rows * D; ++i) out[i] *= scale;
}

void ControlNet::start_forward(const Tensor& latents, const Tensor& adaln, float scale,
                               ControlActivations& ca, Activations& a, Compute& cx,
                               const Observer& observe) {
  const SequenceLayout& l = a.layout;
  const TransformerConfig& b = base_.config();
  const int64_t D = config_.dim, Nx = l.image_rows(), S = l.rows();
  ca.adaln = &adaln;
  ca.scale = scale;
  ca.next_layer = 0;

  // x: the latents embedded as the transformer embeds them; the refiner stage's start
  // c = before_proj(ctx) + x on the image rows, before any refiner runs on x.
  base_.embed_image(latents, ca.x.data(), a, cx);
  {
    const float* p = ca.context.data();
    const float* x = ca.x.data();
    float* c = ca.c.data();
    for (int64_t k = 0; k < Nx * D; ++k) c[k] = p[k] + x[k];
  }
  // The control model's pass of x through the noise refiner; control refiner block j runs
  // when its hint is due (its stream does not depend on x after the start).
  float* hint_rows = ca.scratch.data();
  size_t next = 0;
  for (int64_t i = 0; i < b.n_refiner_layers; ++i) {
    {
      UnitRef w = base_.store().acquire(noise_refiner_unit(i));
      const Tensor mod = base_.modulation(*w, adaln, cx);
      base_.block(*w, mod.data(), ca.x.data(), 0, Nx, a, cx);
    }
    if (next < config_.refiner_places.size() && config_.refiner_places[next] == i) {
      UnitRef w = store_.acquire(control_refiner_unit(int64_t(next)));
      const Tensor mod = base_.modulation(*w, adaln, cx);
      base_.block(*w, mod.data(), ca.c.data(), 0, Nx, a, cx);
      hint(*w, Nx, scale, ca, hint_rows, cx);
      float* x = ca.x.data();
      for (int64_t k = 0; k < Nx * D; ++k) x[k] += hint_rows[k];
      if (observe) observe("controlnet_refiner_hint_" + std::to_string(i), hint_rows, {Nx, D});
      ++next;
    }
  }
  // The layer stage's start: u = [x | caption rows], c = before_proj([c | caption rows]) + u.
  const int64_t caption = S - Nx;
  std::memcpy(ca.x.row(Nx), a.caption.data(), size_t(caption * D) * sizeof(float));
  std::memcpy(ca.c.row(Nx), a.caption.data(), size_t(caption * D) * sizeof(float));
  UnitRef w = store_.acquire(control_layer_unit(0));
  before_proj(*w, ca.x.data(), S, ca, cx);
}

void ControlNet::add_hints(int64_t layer, float* stream, ControlActivations& ca, Activations& a,
                           Compute& cx, const Observer& observe) {
  if (ca.next_layer >= config_.layer_places.size() || config_.layer_places[ca.next_layer] != layer)
    return;
  const SequenceLayout& l = a.layout;
  const int64_t D = config_.dim, S = l.rows();
  UnitRef w = store_.acquire(control_layer_unit(int64_t(ca.next_layer)));
  const Tensor mod = base_.modulation(*w, *ca.adaln, cx);
  base_.block(*w, mod.data(), ca.c.data(), 0, S, a, cx);
  hint(*w, S, ca.scale, ca, ca.x.data(), cx);
  const float* h = ca.x.data();
  for (int64_t k = 0; k < S * D; ++k) stream[k] += h[k];
  if (observe) observe("controlnet_hint_" + std::to_string(layer), h, {S, D});
  ++ca.next_layer;
}

}  // namespace klein::zimage
