// The Z-Image transformer forward (diffusers ZImageTransformer2DModel, basic mode), float32
// activations.
//
// Architecture (Z-Image-Turbo; the tiny test model has dim 256, 2 heads, 2 main layers):
//   D = dim                3840 = 30 heads × 128
//   F = feed-forward       10240 = int(D / 3 · 8); w2(silu(w1 h) ⊙ w3 h)
//   A = adaLN width        256 = min(D, 256): the timestep embedding every modulation reads
//   patch tokens           2×2 patches of the 16-channel latent: 64 features, (dy·2 + dx)·16 + c
//   blocks                 2 noise-refiner (image rows, modulated), 2 context-refiner (caption
//                          rows, not modulated), 30 main layers (all rows, modulated)
//   block                  x += g_a ⊙ RMSNorm(Attn(RMSNorm(x) ⊙ s_a))
//                          x += g_f ⊙ RMSNorm(FFN(RMSNorm(x) ⊙ s_f))
//                          modulated: [s_a | g_a | s_f | g_f] = Linear(adaln), s = 1 + scale,
//                          g = tanh(gate); not modulated: s = g = 1
//   attention              Q, K, V, out without bias; RMSNorm per head on Q and K (eps 1e-5);
//                          RoPE on interleaved pairs, 3 axes (32, 48, 48), θ = 256, angles in
//                          float32; softmax(Q Kᵀ / √128) V over every row, pads included
//   final layer            LayerNorm (no affine, eps 1e-6) ⊙ (1 + Linear(silu(adaln))), then
//                          Linear D → 64, on the image rows
//   timestep               τ = t · 1000; sinusoid of 256 (cos half first); Linear 256 → 1024,
//                          SiLU, Linear 1024 → A
// Every RMSNorm of the blocks and the caption embedder uses norm_eps (1e-5). LoRA updates
// (weights/lora.h) are added beside every linear weight they name: y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ.
#include "models/zimage/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "models/zimage/checkpoint/units.h"
#include "models/zimage/linear.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/low_rank.h"
#include "ops/norm.h"
#include "ops/timestep.h"

namespace klein::zimage {

namespace {

void rms_norm(const float* x, float* y, int64_t rows, int64_t dim, const std::vector<float>& w,
              float eps, Compute& cx) {
  ops::rms_norm(x, y, rows, dim, w.data(), eps, cx);
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

std::vector<int64_t> position_ids(const SequenceLayout& l) {
  std::vector<int64_t> ids;
  ids.reserve(size_t(l.rows() * 3));
  const int64_t cols = l.width / l.patch, caption_rows = l.caption_rows();
  for (int64_t n = 0; n < l.image_rows(); ++n) {
    if (n < l.image_tokens())
      ids.insert(ids.end(), {caption_rows + 1, n / cols, n % cols});
    else
      ids.insert(ids.end(), {0, 0, 0});
  }
  for (int64_t i = 0; i < caption_rows; ++i) ids.insert(ids.end(), {1 + i, 0, 0});
  return ids;
}

Activations::Activations(const TransformerConfig& c, const SequenceLayout& l) : layout(l) {
  check(l.height > 0 && l.width > 0 && l.height % c.patch == 0 && l.width % c.patch == 0,
        "Z-Image transformer: the latent grid ", l.height, "x", l.width,
        " must be positive multiples of the patch size ", c.patch);
  check(l.caption > 0, "Z-Image transformer: the caption needs at least one token");
  const std::vector<int64_t> ids = position_ids(l);
  const int64_t caption_rows = l.caption_rows();
  check(caption_rows + 1 < c.axes_lens[0] && l.height / c.patch <= c.axes_lens[1] &&
            l.width / c.patch <= c.axes_lens[2],
        "Z-Image transformer: positions beyond the model's RoPE range (", c.axes_lens[0], ", ",
        c.axes_lens[1], ", ", c.axes_lens[2], "): caption of ", l.caption, " tokens, ",
        l.height / c.patch, "x", l.width / c.patch, " image tokens");
  rope = ops::RopeTable(ids, c.axes_dims, c.rope_theta, ops::RopeAngle::Float32);
  const int64_t S = l.rows(), D = c.dim, F = c.ffn_hidden();
  const int64_t chunk = std::min(kChunkRows, S);
  seq = Tensor({S, D});
  normed = Tensor({S, D});
  q = Tensor({S, D});
  k = Tensor({S, D});
  v = Tensor({S, D});
  attn = Tensor({S, D});
  gate = Tensor({chunk, F});
  up = Tensor({chunk, F});
  ffn = Tensor({chunk, D});
  caption = Tensor({caption_rows, D});
}

size_t Activations::plan_bytes(const TransformerConfig& c, const SequenceLayout& l) {
  const int64_t S = l.rows(), D = c.dim, F = c.ffn_hidden();
  const int64_t chunk = std::min(kChunkRows, S);
  const int64_t floats = 6 * S * D + chunk * (2 * F + D) + l.caption_rows() * D +
                         2 * S * c.head_dim();  // + cos and sin
  return size_t(floats) * sizeof(float);
}

size_t Activations::bytes() const {
  size_t n = 0;
  for (const Tensor* t :
       {&seq, &normed, &q, &k, &v, &attn, &gate, &up, &ffn, &caption, &rope.cos(), &rope.sin()})
    n += size_t(t->numel()) * sizeof(float);
  return n;
}

Transformer::Transformer(WeightStore& store, const TransformerConfig& config,
                         const Adapters* adapters)
    : store_(store), config_(config), adapters_(adapters) {}

Tensor Transformer::embed_timestep(float t, Compute& cx) {
  UnitRef shared = store_.acquire("transformer.shared");
  float sinusoid[256];
  ops::timestep_sinusoid(t * float(config_.t_scale), sinusoid, 256);
  Tensor hidden({1, 1024});
  linear_bias(sinusoid, 1, *shared, "t_embedder.mlp.0", 1024, 256, hidden.data(), adapters_,
              cx);
  for (int64_t i = 0; i < 1024; ++i) hidden.data()[i] = silu(hidden.data()[i]);
  Tensor adaln({config_.adaln_dim()});
  linear_bias(hidden.data(), 1, *shared, "t_embedder.mlp.2", config_.adaln_dim(), 1024,
              adaln.data(), adapters_, cx);
  return adaln;
}

Tensor Transformer::modulation(const WeightUnit& w, const Tensor& adaln, Compute& cx) {
  const int64_t D = config_.dim;
  Tensor mod({4 * D});
  linear_bias(adaln.data(), 1, w, "adaLN_modulation.0", 4 * D, config_.adaln_dim(), mod.data(),
              adapters_, cx);
  float* m = mod.data();
  for (int64_t i = 0; i < D; ++i) {
    m[i] = 1.0f + m[i];                      // scale_msa
    m[D + i] = std::tanh(m[D + i]);          // gate_msa
    m[2 * D + i] = 1.0f + m[2 * D + i];      // scale_mlp
    m[3 * D + i] = std::tanh(m[3 * D + i]);  // gate_mlp
  }
  return mod;
}

void Transformer::embed_caption(const Tensor& cap_feats, Activations& a, Compute& cx,
                                const Observer& observe) {
  const SequenceLayout& l = a.layout;
  const int64_t D = config_.dim, C = config_.cap_feat_dim, L = l.caption, Lc = l.caption_rows();
  check(cap_feats.shape() == Shape{L, C}, "Z-Image transformer: caption features of shape ",
        shape_str(cap_feats.shape()), ", expected ", shape_str({L, C}));
  const int64_t row0 = l.image_rows();
  float* rows = a.seq.row(row0);
  {
    UnitRef shared = store_.acquire("transformer.shared");
    if (config_.n_refiner_layers > 0) store_.prefetch(context_refiner_unit(0));
    // RMSNorm + Linear on the real rows; the pad rows (copies of the last) become the pad token.
    Tensor normed({L, C});
    rms_norm(cap_feats.data(), normed.data(), L, C, vector_of(*shared, "cap_embedder.0.weight", C),
             float(config_.norm_eps), cx);
    linear_bias(normed.data(), L, *shared, "cap_embedder.1", D, C, rows, adapters_, cx);
    for (int64_t r = L; r < Lc; ++r)
      std::memcpy(a.seq.row(row0 + r), a.seq.row(row0 + L - 1), size_t(D) * sizeof(float));
    if (observe) observe("cap_embedder", rows, {Lc, D});
    const std::vector<float> pad = vector_of(*shared, "cap_pad_token", D);
    for (int64_t r = L; r < Lc; ++r)
      std::memcpy(a.seq.row(row0 + r), pad.data(), size_t(D) * sizeof(float));
    if (observe) observe("cap_seq_in", rows, {Lc, D});
  }
  for (int64_t i = 0; i < config_.n_refiner_layers; ++i) {
    UnitRef w = store_.acquire(context_refiner_unit(i));
    if (i + 1 < config_.n_refiner_layers) store_.prefetch(context_refiner_unit(i + 1));
    block(*w, nullptr, a.seq.data(), row0, Lc, a, cx);
    if (observe) observe("context_refiner_" + std::to_string(i), rows, {Lc, D});
  }
  std::memcpy(a.caption.data(), rows, size_t(Lc * D) * sizeof(float));
}

void Transformer::embed_patches(const Tensor& grid, const WeightUnit& unit,
                                const std::string& embedder, float* out, Activations& a,
                                Compute& cx, const Observer& observe) {
  const SequenceLayout& l = a.layout;
  const int64_t D = config_.dim, C = grid.dim(0), p = config_.patch, H = l.height, W = l.width;
  const int64_t P = p * p * C, cols = W / p, N = l.image_tokens(), Nx = l.image_rows();
  check(grid.shape() == Shape{C, H, W}, "Z-Image transformer: a grid of shape ",
        shape_str(grid.shape()), " for a sequence of ", H, "x", W, " latents");
  // Patchify: token (y, x) holds grid[c, p·y + dy, p·x + dx] at feature (dy·p + dx)·C + c;
  // the pad rows repeat the last token.
  Tensor tokens({Nx, P});
  for (int64_t n = 0; n < N; ++n) {
    const int64_t y = n / cols, x = n % cols;
    float* t = tokens.row(n);
    for (int64_t dy = 0; dy < p; ++dy)
      for (int64_t dx = 0; dx < p; ++dx)
        for (int64_t c = 0; c < C; ++c)
          t[(dy * p + dx) * C + c] = grid.data()[(c * H + p * y + dy) * W + p * x + dx];
  }
  for (int64_t n = N; n < Nx; ++n)
    std::memcpy(tokens.row(n), tokens.row(N - 1), size_t(P) * sizeof(float));
  linear_bias(tokens.data(), Nx, unit, embedder, D, P, out, adapters_, cx);
  if (observe) observe("x_embedder", out, {Nx, D});
  // The pad rows become the transformer's x_pad_token.
  UnitRef shared = store_.acquire("transformer.shared");
  const std::vector<float> pad = vector_of(*shared, "x_pad_token", D);
  for (int64_t r = N; r < Nx; ++r) std::memcpy(out + r * D, pad.data(), size_t(D) * sizeof(float));
  if (observe) observe("x_seq_in", out, {Nx, D});
}

void Transformer::embed_image(const Tensor& latents, float* out, Activations& a, Compute& cx,
                              const Observer& observe) {
  const std::string key =
      std::to_string(config_.patch) + "-" + std::to_string(config_.frame_patch);
  UnitRef shared = store_.acquire("transformer.shared");
  embed_patches(latents, *shared, "all_x_embedder." + key, out, a, cx, observe);
}

Tensor Transformer::forward(const Tensor& latents, const Tensor& adaln, Activations& a, Compute& cx,
                            const Observer& observe, const LayerHook& after_layer) {
  const int64_t D = config_.dim, S = a.layout.rows();
  start(latents, adaln, a, cx, observe);
  for (int64_t i = 0; i < config_.n_layers; ++i) {
    main_layer(i, adaln, a, cx);
    if (after_layer) after_layer(i, a.seq.data());
    if (observe) observe("layers_" + std::to_string(i), a.seq.data(), {S, D});
  }
  return finish(adaln, a, cx, observe);
}

void Transformer::start(const Tensor& latents, const Tensor& adaln, Activations& a, Compute& cx,
                        const Observer& observe) {
  const SequenceLayout& l = a.layout;
  const int64_t D = config_.dim, C = config_.in_channels, Nx = l.image_rows(), S = l.rows();
  check(latents.shape() == Shape{C, l.height, l.width}, "Z-Image transformer: latents of shape ",
        shape_str(latents.shape()), ", expected ", shape_str({C, l.height, l.width}));
  check(adaln.numel() == config_.adaln_dim(), "Z-Image transformer: modulation input of ",
        adaln.numel(), " values, expected ", config_.adaln_dim());
  if (observe) observe("t_embedder", adaln.data(), {1, config_.adaln_dim()});
  if (config_.n_refiner_layers > 0) store_.prefetch(noise_refiner_unit(0));

  embed_image(latents, a.seq.data(), a, cx, observe);
  std::memcpy(a.seq.row(Nx), a.caption.data(), size_t(a.caption.numel()) * sizeof(float));

  for (int64_t i = 0; i < config_.n_refiner_layers; ++i) {
    // Each unit acquired while the next one is read ahead (and checked, paged).
    UnitRef w = store_.acquire(noise_refiner_unit(i));
    if (i + 1 < config_.n_refiner_layers) store_.prefetch(noise_refiner_unit(i + 1));
    else if (config_.n_layers > 0) store_.prefetch(layer_unit(0));
    const Tensor mod = modulation(*w, adaln, cx);
    block(*w, mod.data(), a.seq.data(), 0, Nx, a, cx);
    if (observe) observe("noise_refiner_" + std::to_string(i), a.seq.data(), {Nx, D});
  }
  if (observe) observe("unified_in", a.seq.data(), {S, D});
}

void Transformer::main_layer(int64_t i, const Tensor& adaln, Activations& a, Compute& cx,
                             float* padding_row, const std::string* next) {
  UnitRef w = store_.acquire(layer_unit(i));
  // After the last layer the first unit of the next forward (the next step, or the
  // negative pass); after a generation's last forward the transformer's release drops it.
  if (next) {
    if (!next->empty()) store_.prefetch(*next);
  } else if (i + 1 < config_.n_layers) {
    store_.prefetch(layer_unit(i + 1));
  } else if (config_.n_refiner_layers > 0) {
    store_.prefetch(noise_refiner_unit(0));
  }
  const Tensor mod = modulation(*w, adaln, cx);
  block(*w, mod.data(), a.seq.data(), 0, a.layout.rows(), a, cx);
  if (padding_row) zero_row(*w, mod.data(), a, cx, padding_row);
}

// A zero row through a block beside the sequence's rows, attending to them and attended by
// none: RMSNorm of zero is zero, so are its query, key and value; its scores are all 0 and its
// attention output is the plain mean of the sequence's values (act.v, as block() left them).
void Transformer::zero_row(const WeightUnit& w, const float* mod, Activations& a, Compute& cx,
                           float* out) {
  const int64_t D = config_.dim, F = config_.ffn_hidden(), S = a.layout.rows();
  const float eps = float(config_.norm_eps);
  std::vector<double> sum(size_t(D), 0.0);
  for (int64_t r = 0; r < S; ++r) {
    const float* v = a.v.row(r);
    for (int64_t i = 0; i < D; ++i) sum[size_t(i)] += v[i];
  }
  std::vector<float> mean(static_cast<size_t>(D)), projected(static_cast<size_t>(D)), h(static_cast<size_t>(D)), f(static_cast<size_t>(D));
  for (int64_t i = 0; i < D; ++i) mean[size_t(i)] = float(sum[size_t(i)] / double(S));
  linear(mean.data(), 1, matrix(w, "attention.to_out.0.weight", D, D), projected.data(),
         adapters_, cx);
  rms_norm(projected.data(), projected.data(), 1, D, vector_of(w, "attention_norm2.weight", D),
           eps, cx);
  // mod: [scale_msa | gate_msa | scale_mlp | gate_mlp]; scale_msa scales a zero row.
  const float *gate_msa = mod + D, *scale_mlp = mod + 2 * D, *gate_mlp = mod + 3 * D;
  for (int64_t i = 0; i < D; ++i) out[i] = 0.0f + gate_msa[i] * projected[size_t(i)];
  rms_norm(out, h.data(), 1, D, vector_of(w, "ffn_norm1.weight", D), eps, cx);
  for (int64_t i = 0; i < D; ++i) h[size_t(i)] *= scale_mlp[i];
  std::vector<float> g(static_cast<size_t>(F)), u(static_cast<size_t>(F));
  linear(h.data(), 1, matrix(w, "feed_forward.w1.weight", F, D), g.data(), adapters_, cx);
  linear(h.data(), 1, matrix(w, "feed_forward.w3.weight", F, D), u.data(), adapters_, cx);
  ops::swiglu(g.data(), u.data(), g.data(), F, cx);
  linear(g.data(), 1, matrix(w, "feed_forward.w2.weight", D, F), f.data(), adapters_, cx);
  rms_norm(f.data(), f.data(), 1, D, vector_of(w, "ffn_norm2.weight", D), eps, cx);
  for (int64_t i = 0; i < D; ++i) out[i] += gate_mlp[i] * f[size_t(i)];
}

Tensor Transformer::finish(const Tensor& adaln, Activations& a, Compute& cx,
                           const Observer& observe) {
  const SequenceLayout& l = a.layout;
  const int64_t D = config_.dim, C = config_.in_channels, P = config_.patch_features();
  const int64_t p = config_.patch, H = l.height, W = l.width, cols = W / p;
  const int64_t N = l.image_tokens();
  const std::string key = std::to_string(p) + "-" + std::to_string(config_.frame_patch);
  // Final layer on the image rows: LayerNorm ⊙ (1 + Linear(silu(adaln))), then Linear D → P.
  Tensor out_tokens({N, P});
  {
    UnitRef shared = store_.acquire("transformer.shared");
    const std::string f = "all_final_layer." + key;
    Tensor act({config_.adaln_dim()});
    for (int64_t i = 0; i < act.numel(); ++i) act.data()[i] = silu(adaln.data()[i]);
    Tensor scale({D});
    linear_bias(act.data(), 1, *shared, f + ".adaLN_modulation.1", D, config_.adaln_dim(),
                scale.data(), adapters_, cx);
    ops::layer_norm(a.seq.data(), a.normed.data(), N, D, 1e-6f, cx);
    for (int64_t r = 0; r < N; ++r) {
      float* row = a.normed.row(r);
      for (int64_t i = 0; i < D; ++i) row[i] *= 1.0f + scale.data()[i];
    }
    linear_bias(a.normed.data(), N, *shared, f + ".linear", P, D, out_tokens.data(), adapters_,
                cx);
    if (observe) observe("final_layer", out_tokens.data(), {N, P});
  }

  // Un-patchify.
  Tensor out({C, H, W});
  for (int64_t n = 0; n < N; ++n) {
    const int64_t y = n / cols, x = n % cols;
    const float* t = out_tokens.row(n);
    for (int64_t dy = 0; dy < p; ++dy)
      for (int64_t dx = 0; dx < p; ++dx)
        for (int64_t c = 0; c < C; ++c)
          out.data()[(c * H + p * y + dy) * W + p * x + dx] = t[(dy * p + dx) * C + c];
  }
  return out;
}

// x += g_a ⊙ RMSNorm_a2(Attn(RMSNorm_a1(x) ⊙ s_a)); x += g_f ⊙ RMSNorm_f2(FFN(RMSNorm_f1(x) ⊙
// s_f)).
void Transformer::block(const WeightUnit& w, const float* mod, float* stream, int64_t row0,
                        int64_t rows, Activations& a, Compute& cx) {
  const int64_t D = config_.dim;
  const float eps = float(config_.norm_eps);
  float* x = stream + row0 * D;
  float* h = a.normed.row(row0);

  rms_norm(x, h, rows, D, vector_of(w, "attention_norm1.weight", D), eps, cx);
  if (mod)
    cx.pool().parallel_for(
        rows,
        [&](int64_t r0, int64_t r1, int) {
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t i = 0; i < D; ++i) h[r * D + i] *= mod[i];
        },
        16);
  attention(w, row0, rows, a, cx);
  // The attention output, normalised, gated into the stream.
  float* o = a.normed.row(row0);
  rms_norm(a.q.row(row0), o, rows, D, vector_of(w, "attention_norm2.weight", D), eps, cx);
  const float* gate = mod ? mod + D : nullptr;
  cx.pool().parallel_for(
      rows,
      [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t i = 0; i < D; ++i) x[r * D + i] += (gate ? gate[i] : 1.0f) * o[r * D + i];
      },
      16);

  feed_forward(w, mod ? mod + 2 * D : nullptr, mod ? mod + 3 * D : nullptr, stream, row0, rows,
               a, cx);
}

// Attention of rows [row0, row0 + rows) among themselves, reading act.normed; the projected
// output goes to act.q's rows (free once attention is done).
void Transformer::attention(const WeightUnit& w, int64_t row0, int64_t rows, Activations& a,
                            Compute& cx) {
  const int64_t D = config_.dim, H = config_.n_heads, hd = config_.head_dim();
  const float* h = a.normed.row(row0);
  float* q = a.q.row(row0);
  float* k = a.k.row(row0);
  float* v = a.v.row(row0);
  linear(h, rows, matrix(w, "attention.to_q.weight", D, D), q, adapters_, cx);
  linear(h, rows, matrix(w, "attention.to_k.weight", D, D), k, adapters_, cx);
  linear(h, rows, matrix(w, "attention.to_v.weight", D, D), v, adapters_, cx);
  // RMSNorm per head (rows · H rows of head_dim), then RoPE.
  rms_norm(q, q, rows * H, hd, vector_of(w, "attention.norm_q.weight", hd), 1e-5f, cx);
  rms_norm(k, k, rows * H, hd, vector_of(w, "attention.norm_k.weight", hd), 1e-5f, cx);
  a.rope.apply(q, D, row0, rows, H, cx);
  a.rope.apply(k, D, row0, rows, H, cx);

  ops::AttentionParams p;
  p.q_len = p.kv_len = rows;
  p.heads = p.kv_heads = H;
  p.head_dim = hd;
  p.scale = float(1.0 / std::sqrt(double(hd)));
  float* out = a.attn.row(row0);
  ops::attention(q, D, k, D, v, D, out, D, p, cx);
  linear(out, rows, matrix(w, "attention.to_out.0.weight", D, D), q, adapters_, cx);
}

// x += g_f ⊙ RMSNorm_f2(w2(silu(w1 h) ⊙ w3 h)), h = RMSNorm_f1(x) ⊙ s_f, in chunks of rows.
void Transformer::feed_forward(const WeightUnit& w, const float* scale, const float* gate,
                               float* stream, int64_t row0, int64_t rows, Activations& a,
                               Compute& cx) {
  const int64_t D = config_.dim, F = config_.ffn_hidden();
  const float eps = float(config_.norm_eps);
  const Weight& w1 = matrix(w, "feed_forward.w1.weight", F, D);
  const Weight& w3 = matrix(w, "feed_forward.w3.weight", F, D);
  const Weight& w2 = matrix(w, "feed_forward.w2.weight", D, F);
  const std::vector<float> norm1 = vector_of(w, "ffn_norm1.weight", D);
  const std::vector<float> norm2 = vector_of(w, "ffn_norm2.weight", D);
  float* x = stream + row0 * D;
  float* h = a.normed.row(row0);
  rms_norm(x, h, rows, D, norm1, eps, cx);
  if (scale)
    cx.pool().parallel_for(
        rows,
        [&](int64_t r0, int64_t r1, int) {
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t i = 0; i < D; ++i) h[r * D + i] *= scale[i];
        },
        16);
  const int64_t chunk = a.gate.dim(0);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t m = std::min(chunk, rows - r0);
    linear(h + r0 * D, m, w1, a.gate.data(), adapters_, cx);
    linear(h + r0 * D, m, w3, a.up.data(), adapters_, cx);
    ops::swiglu(a.gate.data(), a.up.data(), a.gate.data(), m * F, cx);
    linear(a.gate.data(), m, w2, a.ffn.data(), adapters_, cx);
    rms_norm(a.ffn.data(), a.ffn.data(), m, D, norm2, eps, cx);
    const float* f = a.ffn.data();
    float* xr = x + r0 * D;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t i = 0; i < D; ++i) xr[r * D + i] += (gate ? gate[i] : 1.0f) * f[r * D + i];
  }
}

ops::ForwardWork forward_work(const TransformerConfig& c, const SequenceLayout& layout) {
  const double D = double(c.dim), F = double(c.ffn_hidden()), A = double(c.adaln_dim());
  const double image = double(layout.image_rows()), caption = double(layout.caption_rows());
  const double refiners = double(c.n_refiner_layers), main = double(c.n_layers);
  const double per_row = 4 * D * D + 3 * F * D;
  ops::ForwardWork w;
  w.linear_macs = per_row * (refiners * image + refiners * caption + main * (image + caption));
  w.linear_macs += 256.0 * 1024 + 1024 * A;                 // the timestep embedding's MLP
  w.linear_macs += (refiners + main) * 4 * D * A + D * A;  // modulation; the final layer's
  const double patch = double(c.patch_features());
  w.linear_macs += image * patch * D + image * D * patch;  // x_embedder, final projection
  auto attention = [&](double rows) { return 2 * rows * rows * D; };
  w.attention_macs = refiners * attention(image) + refiners * attention(caption) +
                     main * attention(image + caption);
  return w;
}

}  // namespace klein::zimage
