// The FLUX.2 transformer forward (diffusers Flux2Transformer2DModel), float32 activations.
//
// Architecture (klein-4B; the tiny test model has 2 heads and 2 + 2 blocks):
//   D = inner dim           3072 = 24 heads × 128
//   F = MLP hidden          9216 = 3·D; SwiGLU: linear_in gives [gate | up], 2F wide
//   T = text tokens          512 context rows (pads included, no mask), context width 7680
//   in / out channels        128 (2×2-packed VAE latents)
//   double-stream blocks       5 text and image keep their own weights, attend jointly
//   single-stream blocks      20 one fused QKV+MLP projection, attention ∥ MLP
//   RoPE                      4 axes × 32 dims (t, h, w, l), θ = 2000, interleaved pairs
//   norms                     LayerNorm without affine (eps 1e-6) under every modulation;
//                             RMSNorm per head (weight [128], eps 1e-6) on Q and K
//   modulation                (1 + scale) ⊙ LN(x) + shift; block chunks shift, scale, gate;
//                             norm_out chunks scale, shift
//   timestep                  τ = 1000·t; sinusoid of 256 (cos half first, f_i = 10000^(−i/128));
//                             temb = linear_2 · silu(linear_1 · sinusoid); FLUX.2-dev adds the
//                             same embedding of 1000·guidance through its own two linears
//   attention                 softmax(Q Kᵀ / √128) V per head, tiled (ops::attention)
// No layer has a bias. Sequence order: [text | target | references] (positions.h).
#include "models/flux2/transformer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/finite.h"
#include "ops/linear.h"
#include "ops/low_rank.h"
#include "ops/norm.h"
#include "ops/timestep.h"

namespace klein::flux2 {

namespace {

// --- checked weights -------------------------------------------------------------------------

const Weight& linear_weight(const WeightUnit& unit, std::string_view name, int64_t out,
                            int64_t in) {
  const Weight& w = unit.get(name);
  if (w.shape.size() != 2 || w.shape[0] != out || w.shape[1] != in)
    fail("tensor ", w.name, ": expected shape ", shape_str({out, in}), ", got ",
         shape_str(w.shape));
  return w;
}

const Weight& vector_weight(const WeightUnit& unit, std::string_view name, int64_t n) {
  const Weight& w = unit.get(name);
  if (w.shape.size() != 1 || w.shape[0] != n)
    fail("tensor ", w.name, ": expected shape ", shape_str({n}), ", got ", shape_str(w.shape));
  if (!dtype_is_float(w.dtype) || w.layout != 0)
    fail("tensor ", w.name, ": expected a plain float type for a norm weight, got ",
         dtype_name(w.dtype));
  return w;
}

// --- row-wise pieces -------------------------------------------------------------------------

// x += gate ⊙ y for `rows` rows of width D (both contiguous).
void add_gated(float* x, const float* y, int64_t rows, int64_t D, const float* gate,
               Compute& cx) {
  cx.pool().parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float* xr = x + r * D;
      const float* yr = y + r * D;
      for (int64_t i = 0; i < D; ++i) xr[i] = xr[i] + gate[i] * yr[i];
    }
  }, 16);
}

// out[r, :F] = silu(in[r, :F]) ⊙ in[r, F:2F], rows of `in` 2F apart, rows of `out` ldo apart.
void swiglu_rows(const float* in, int64_t F, float* out, int64_t ldo, int64_t rows,
                 Compute& cx) {
  cx.pool().parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* gate = in + r * 2 * F;
      ops::swiglu(gate, gate + F, out + r * ldo, F, cx);
    }
  }, 4);
}

void copy_rows(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t rows,
               int64_t width) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * ld_dst, src + r * ld_src, size_t(width) * sizeof(float));
}

// Per-head RMSNorm of Q or K, in place: x is [rows, heads·head_dim], every head normalised
// on its own with the same [head_dim] weight.
void head_rms_norm(const Weight& w, float* x, int64_t rows, int64_t heads, float eps,
                   Tensor& weight, Compute& cx) {
  const int64_t head_dim = weight.numel();
  to_f32(w.dtype, w.data, weight.data(), size_t(head_dim));
  ops::rms_norm(x, x, rows * heads, head_dim, weight.data(), eps, cx);
}

}  // namespace

// --- per-generation and per-step state -------------------------------------------------------

Modulation::Modulation(const TransformerConfig& c)
    : temb({c.inner_dim()}),
      img({6 * c.inner_dim()}),
      txt({6 * c.inner_dim()}),
      single({3 * c.inner_dim()}),
      out({2 * c.inner_dim()}),
      sinusoid({c.timestep_channels}),
      hidden({c.inner_dim()}) {}

Activations::Activations(const TransformerConfig& c, const TokenLayout& l, int64_t chunk,
                         int64_t cached, int64_t batch)
    : layout(l), cached_rows(cached), images(batch) {
  const bool references_only = l.text_tokens == 0 && l.target.tokens() == 0 &&
                               !l.references.empty();
  if (!references_only) {
    check(l.text_tokens > 0, "transformer: the text needs at least one token");
    check(l.target.rows > 0 && l.target.cols > 0, "transformer: empty target grid ",
          l.target.rows, "x", l.target.cols);
  }
  for (const LatentGrid& g : l.references)
    check(g.rows > 0 && g.cols > 0, "transformer: empty reference grid ", g.rows, "x", g.cols);
  check(chunk > 0, "transformer: chunk_rows must be positive, got ", chunk);
  check(cached >= 0, "transformer: negative cached rows ", cached);
  check(batch >= 1, "transformer: a batch needs at least one image, got ", batch);
  check(batch == 1 || !references_only, "transformer: the reference pass is one image");
  check(batch == 1 || l.text_tokens >= ops::kSamePathRows, "transformer: a batch needs at "
        "least ", ops::kSamePathRows, " text tokens per image, got ", l.text_tokens);
  const int64_t S = l.total_tokens(), D = c.inner_dim(), F = c.mlp_hidden();
  const int64_t rows = batch * S;
  chunk_rows = std::min(chunk, rows);
  const int64_t longest = std::min(chunk_rows + ops::kSamePathRows - 1, rows);
  for (Tensor* t : {&stream, &normed, &q, &attn}) *t = Tensor({rows, D});
  if (batch == 1) {
    for (Tensor* t : {&k, &v}) *t = Tensor({S + cached, D});
  } else {
    for (Tensor* t : {&k, &v}) *t = Tensor({rows, D});
    for (Tensor* t : {&one_q, &one_attn}) *t = Tensor({S, D});
    for (Tensor* t : {&one_k, &one_v}) *t = Tensor({S + cached, D});
  }
  mlp_in = Tensor({longest, 2 * F});
  mlp_cat = Tensor({longest, D + F});
  proj = Tensor({longest, D});
  head_norm = Tensor({c.head_dim});
}

size_t Activations::plan_bytes(const TransformerConfig& c, const TokenLayout& l, int64_t chunk,
                               int64_t cached, int64_t batch) {
  const int64_t S = l.total_tokens(), D = c.inner_dim(), F = c.mlp_hidden();
  const int64_t all = batch * S;
  const int64_t rows = std::min(std::min(chunk, all) + ops::kSamePathRows - 1, all);
  // B > 1: one image's Q, K, V and output gathered for attention, beside the B·S rows.
  const int64_t one = batch == 1 ? 0 : 4 * S * D;
  const int64_t floats =
      6 * all * D + one + 2 * cached * D + rows * (2 * F + (D + F) + D) + c.head_dim;
  return size_t(floats) * sizeof(float);
}

int64_t Activations::chunk_at(int64_t done, int64_t rows) const {
  const int64_t rest = rows - done;
  return rest < chunk_rows + ops::kSamePathRows ? rest : chunk_rows;
}

size_t Activations::bytes() const {
  size_t n = 0;
  for (const Tensor* t : {&stream, &normed, &q, &k, &v, &attn, &mlp_in, &mlp_cat, &proj,
                          &head_norm, &one_q, &one_k, &one_v, &one_attn})
    n += size_t(t->numel()) * sizeof(float);
  return n;
}

// --- the model -------------------------------------------------------------------------------

Transformer::Transformer(WeightStore& store, const Adapters* adapters)
    : store_(store), config_(store.config().transformer), adapters_(adapters) {
  const TransformerConfig& c = config_;
  check(c.num_heads > 0 && c.head_dim > 0 && c.head_dim % 2 == 0,
        "transformer config: expected positive heads and an even head dim, got ", c.num_heads,
        " x ", c.head_dim);
  int64_t rope_dims = 0;
  for (int64_t a : c.rope_axes) rope_dims += a;
  check(rope_dims == c.head_dim, "transformer config: axes_dims_rope sum to ", rope_dims,
        ", expected the head dim ", c.head_dim);
  check(c.timestep_channels > 0 && c.timestep_channels % 2 == 0,
        "transformer config: timestep_guidance_channels must be even, got ", c.timestep_channels);
  for (int64_t i = 0; i < c.num_double_blocks; ++i) block_units_.push_back(double_block_unit(i));
  for (int64_t i = 0; i < c.num_single_blocks; ++i) block_units_.push_back(single_block_unit(i));
}

// y = x · Wᵀ, plus the LoRA updates of W when there are any.
void Transformer::linear(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y,
                         int64_t ldy, Compute& cx) const {
  ops::linear(x, M, ldx, w, y, ldy, cx);
  add_updates(x, M, ldx, w, 0, w.rows(), y, ldy, cx);
}

void Transformer::linear(const float* x, int64_t M, const Weight& w, float* y,
                         Compute& cx) const {
  linear(x, M, w.cols(), w, y, w.rows(), cx);
}

// Rows [begin, end) of W (a part of a fused projection): y = x · W[begin:end]ᵀ [+ updates].
void Transformer::linear_rows(const float* x, int64_t M, const Weight& w, int64_t begin,
                              int64_t end, float* y, Compute& cx) const {
  ops::linear(x, M, ops::weight_rows(w, begin, end), y, cx);
  add_updates(x, M, w.cols(), w, begin, end, y, end - begin, cx);
}

// y += s · (x · Aᵀ) · B[begin:end]ᵀ for every LoRA update of W.
void Transformer::add_updates(const float* x, int64_t M, int64_t ldx, const Weight& w,
                              int64_t begin, int64_t end, float* y, int64_t ldy,
                              Compute& cx) const {
  if (!adapters_) return;
  for (const LoraUpdate& u : adapters_->on(w.name)) {
    const int64_t rank = u.down.dim(0);
    ops::add_low_rank(x, M, ldx, u.down.data(), u.up.row(begin), end - begin, w.cols(), rank,
                      u.scale, y, ldy, cx);
  }
}

Tensor Transformer::embed_text(const Tensor& context, Compute& cx) {
  const int64_t D = config_.inner_dim();
  check(context.shape().size() == 2 && context.dim(1) == config_.context_dim,
        "text context: expected [tokens, ", config_.context_dim, "] (3 x the text encoder's hidden"
        " size), got ", shape_str(context.shape()));
  UnitRef shared = store_.acquire("transformer.shared");
  const Weight& w = linear_weight(*shared, "context_embedder.weight", D, config_.context_dim);
  Tensor out({context.dim(0), D});
  linear(context.data(), context.dim(0), w, out.data(), cx);  // C = context_embedder · ctx
  return out;
}

Tensor Transformer::embed_references(std::span<const ReferenceTokens> refs, Compute& cx) {
  const int64_t D = config_.inner_dim(), in = config_.in_channels;
  int64_t total = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    const ReferenceTokens& r = refs[i];
    check(r.tokens && r.tokens->shape() == Shape{r.grid.tokens(), in}, "reference ", i,
          ": expected tokens ", shape_str({r.grid.tokens(), in}), " for a ", r.grid.rows, "x",
          r.grid.cols, " latent grid, got ", r.tokens ? shape_str(r.tokens->shape()) : "none");
    total += r.grid.tokens();
  }
  Tensor out({total, D});
  if (total == 0) return out;
  UnitRef shared = store_.acquire("transformer.shared");
  const Weight& w = linear_weight(*shared, "x_embedder.weight", D, in);
  int64_t row = 0;
  for (const ReferenceTokens& r : refs) {
    linear(r.tokens->data(), r.grid.tokens(), w, out.row(row), cx);
    row += r.grid.tokens();
  }
  return out;
}

void Transformer::modulate(float timestep, Modulation& m, Compute& cx,
                           std::optional<float> guidance) {
  const int64_t D = config_.inner_dim(), channels = config_.timestep_channels;
  check(guidance.has_value() || !config_.guidance_embeds, "transformer: this model embeds the "
        "guidance value (FLUX.2-dev) and none was given");
  UnitRef shared = store_.acquire("transformer.shared");
  const WeightUnit& w = *shared;

  // e(v) = linear_2 · silu(linear_1 · sinusoid(1000·v)) with one embedder's weights  [D]
  auto embed = [&](float value, const std::string& embedder, float* out) {
    ops::timestep_sinusoid(value * 1000.0f, m.sinusoid.data(), channels);
    linear(m.sinusoid.data(), 1, linear_weight(w, embedder + "linear_1.weight", D, channels),
           m.hidden.data(), cx);
    ops::silu_inplace(m.hidden.data(), D);
    linear(m.hidden.data(), 1, linear_weight(w, embedder + "linear_2.weight", D, D), out, cx);
  };
  // temb = e_timestep(t) [+ e_guidance(g)]                                         [D]
  embed(timestep, "time_guidance_embed.timestep_embedder.", m.temb.data());
  if (config_.guidance_embeds) {
    embed(*guidance, "time_guidance_embed.guidance_embedder.", m.single.data());  // scratch
    for (int64_t i = 0; i < D; ++i) m.temb.data()[i] += m.single.data()[i];
  }

  // Every modulation linear reads silu(temb).                                     [D]
  std::memcpy(m.hidden.data(), m.temb.data(), size_t(D) * sizeof(float));
  ops::silu_inplace(m.hidden.data(), D);
  const float* s = m.hidden.data();
  linear(s, 1, linear_weight(w, "double_stream_modulation_img.linear.weight", 6 * D, D),
              m.img.data(), cx);                                                // [6D]
  linear(s, 1, linear_weight(w, "double_stream_modulation_txt.linear.weight", 6 * D, D),
              m.txt.data(), cx);                                                // [6D]
  linear(s, 1, linear_weight(w, "single_stream_modulation.linear.weight", 3 * D, D),
              m.single.data(), cx);                                             // [3D]
  linear(s, 1, linear_weight(w, "norm_out.linear.weight", 2 * D, D), m.out.data(),
              cx);                                                              // [2D]
}

Transformer::OwnedWeight Transformer::copy_weight(const Weight& w) {
  constexpr size_t kAlign = 4096;  // like the mapping: kernels see the same alignment
  const size_t n = std::max<size_t>(kAlign, (w.nbytes + kAlign - 1) / kAlign * kAlign);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kAlign, n));
  if (!p) throw std::bad_alloc();
  OwnedWeight o;
  o.bytes = std::shared_ptr<std::byte>(p, [](std::byte* q) { std::free(q); });
  std::memcpy(p, w.data, w.nbytes);
  o.weight = w;
  o.weight.data = p;
  return o;
}

void Transformer::keep_io_weights() {
  const int64_t D = config_.inner_dim();
  UnitRef shared = store_.acquire("transformer.shared");
  x_embedder_ = copy_weight(linear_weight(*shared, "x_embedder.weight", D, config_.in_channels));
  proj_out_ = copy_weight(linear_weight(*shared, "proj_out.weight", config_.out_channels, D));
}

// One stream of a double block: its rows of the joint sequence, its weights, its modulation.
struct Transformer::Stream {
  int64_t row0, rows;
  const Weight &to_q, &to_k, &to_v, &norm_q, &norm_k, &to_out, &ff_in, &ff_out;
  const float *shift1, *scale1, *gate1, *shift2, *scale2, *gate2;
};

namespace {

// The six modulation chunks of a double-block stream, in the checkpoint's order.
std::array<const float*, 6> six_chunks(const Tensor& m, int64_t D) {
  const float* p = m.data();
  return {p, p + D, p + 2 * D, p + 3 * D, p + 4 * D, p + 5 * D};
}

// The names of one stream's weights in a double block (diffusers' spelling).
struct StreamWeights {
  const char *to_q, *to_k, *to_v, *norm_q, *norm_k, *to_out, *ff_in, *ff_out;
};
constexpr StreamWeights kTextWeights{
    "attn.add_q_proj.weight",   "attn.add_k_proj.weight",   "attn.add_v_proj.weight",
    "attn.norm_added_q.weight", "attn.norm_added_k.weight", "attn.to_add_out.weight",
    "ff_context.linear_in.weight", "ff_context.linear_out.weight"};
constexpr StreamWeights kImageWeights{
    "attn.to_q.weight",   "attn.to_k.weight",   "attn.to_v.weight",
    "attn.norm_q.weight", "attn.norm_k.weight", "attn.to_out.0.weight",
    "ff.linear_in.weight", "ff.linear_out.weight"};

}  // namespace

// The double-stream block: text and image are normalised, projected and finished with their
// own weights; attention runs once over the joint rows [text | image].
void Transformer::double_block(const WeightUnit& w, const Modulation& mod, const RopeTable& rope,
                               Activations& a, const BlockKV& kv, Compute& cx) {
  const int64_t D = config_.inner_dim(), F = config_.mlp_hidden(), H = config_.num_heads,
                hd = config_.head_dim;
  const float eps = float(config_.eps);
  // The text rows of every image, then their image rows (Activations): each stream's rows of
  // all images at once, but a small image's (fewer rows than ops::kSamePathRows) one image
  // at a time, as they are alone.
  const int64_t B = a.images, T = a.layout.text_tokens, N = a.layout.image_tokens();
  auto stream = [&](int64_t row0, int64_t rows, const StreamWeights& n, const Tensor& m) {
    const auto c = six_chunks(m, D);
    return Stream{row0, rows,
                  linear_weight(w, n.to_q, D, D),
                  linear_weight(w, n.to_k, D, D),
                  linear_weight(w, n.to_v, D, D),
                  vector_weight(w, n.norm_q, hd),
                  vector_weight(w, n.norm_k, hd),
                  linear_weight(w, n.to_out, D, D),
                  linear_weight(w, n.ff_in, 2 * F, D),
                  linear_weight(w, n.ff_out, D, F),
                  c[0], c[1], c[2], c[3], c[4], c[5]};
  };
  const Stream text = stream(0, B * T, kTextWeights, mod.txt);
  const bool stacked = B == 1 || N >= ops::kSamePathRows;
  const Stream image = stream(B * T, stacked ? B * N : N, kImageWeights, mod.img);
  const int64_t parts = stacked ? 1 : B;  // the image stream's pieces
  auto image_part = [&](int64_t j) {
    Stream s = image;
    s.row0 = a.image_row(j);
    return s;
  };
  auto project = [&](const Stream* s) {
    const int64_t r = s->row0, n = s->rows;
    if (n == 0) return;  // the reference pass of the K/V cache has no text
    // A = (1 + scale1) ⊙ LN(x) + shift1                                         [n, D]
    ops::modulated_layer_norm(a.stream.row(r), a.normed.row(r), n, D, eps, s->scale1, s->shift1,
                              cx);
    // Q, K, V = projections of A, at this stream's rows of the joint buffers    [n, D] each
    linear(a.normed.row(r), n, s->to_q, a.q.row(r), cx);
    linear(a.normed.row(r), n, s->to_k, a.k.row(r), cx);
    linear(a.normed.row(r), n, s->to_v, a.v.row(r), cx);
    // Q, K ← RMSNorm per head (this stream's weights)                           [n, H, 128]
    head_rms_norm(s->norm_q, a.q.row(r), n, H, eps, a.head_norm, cx);
    head_rms_norm(s->norm_k, a.k.row(r), n, H, eps, a.head_norm, cx);
  };
  project(&text);
  for (int64_t j = 0; j < parts; ++j) {
    const Stream part = image_part(j);
    project(&part);
  }
  // O = softmax(RoPE(Q) RoPE(K)ᵀ / √128) V over each image's T + N rows          [T+N, D]
  attention(rope, a, kv, cx);
  // x += gate1 ⊙ out·O;  x += gate2 ⊙ FF(mod(x; shift2, scale2)), per stream
  finish_stream_rows(text, a, cx);
  for (int64_t j = 0; j < parts; ++j) finish_stream_rows(image_part(j), a, cx);
}

// The rest of a double block for one stream; every row is independent after attention, so
// this runs chunk by chunk to bound the MLP buffers.
void Transformer::finish_stream_rows(const Stream& s, Activations& a, Compute& cx) {
  const int64_t D = config_.inner_dim(), F = config_.mlp_hidden();
  const float eps = float(config_.eps);
  float* hidden = a.mlp_cat.data() + D;  // [c, F] in columns [D, D+F) of mlp_cat
  const int64_t ld_hidden = D + F;
  for (int64_t r = s.row0, n = 0; r < s.row0 + s.rows; r += n) {
    n = a.chunk_at(r - s.row0, s.rows);
    float* x = a.stream.row(r);
    // x += gate1 ⊙ (to_out · O)                                                  [n, D]
    linear(a.attn.row(r), n, s.to_out, a.proj.data(), cx);
    add_gated(x, a.proj.data(), n, D, s.gate1, cx);
    // x += gate2 ⊙ linear_out · (silu(g) ⊙ p),  [g | p] = linear_in · mod(x; shift2, scale2)
    ops::modulated_layer_norm(x, a.normed.row(r), n, D, eps, s.scale2, s.shift2, cx);    // [n, D]
    linear(a.normed.row(r), n, s.ff_in, a.mlp_in.data(), cx);              // [n, 2F]
    swiglu_rows(a.mlp_in.data(), F, hidden, ld_hidden, n, cx);                  // [n, F]
    linear(hidden, n, ld_hidden, s.ff_out, a.proj.data(), D, cx);          // [n, D]
    add_gated(x, a.proj.data(), n, D, s.gate2, cx);
  }
}

// The single-stream block over all rows S = [text | image]: one modulated norm, one fused
// projection to Q, K, V, gate, up; attention and MLP in parallel; one gated residual.
void Transformer::single_block(const WeightUnit& w, const Modulation& mod, const RopeTable& rope,
                               Activations& a, const BlockKV& kv, Compute& cx) {
  const int64_t D = config_.inner_dim(), F = config_.mlp_hidden(), H = config_.num_heads,
                hd = config_.head_dim;
  const float eps = float(config_.eps);
  const int64_t S = a.rows();  // every image's rows: each row alike until attention
  const float *shift = mod.single.data(), *scale = shift + D, *gate = shift + 2 * D;
  // Rows of the fused projection: Q, K, V (D each), gate, up (F each).
  const Weight& fused = linear_weight(w, "attn.to_qkv_mlp_proj.weight", 3 * D + 2 * F, D);
  const Weight& to_out = linear_weight(w, "attn.to_out.weight", D, D + F);

  // A = (1 + scale) ⊙ LN(S) + shift                                              [S, D]
  ops::modulated_layer_norm(a.stream.data(), a.normed.data(), S, D, eps, scale, shift, cx);
  // Q, K, V = the first 3D rows of the fused projection                          [S, D] each
  linear_rows(a.normed.data(), S, fused, 0, D, a.q.data(), cx);
  linear_rows(a.normed.data(), S, fused, D, 2 * D, a.k.data(), cx);
  linear_rows(a.normed.data(), S, fused, 2 * D, 3 * D, a.v.data(), cx);
  // Q, K ← RMSNorm per head                                                      [S, H, 128]
  const Weight& norm_q = vector_weight(w, "attn.norm_q.weight", hd);
  const Weight& norm_k = vector_weight(w, "attn.norm_k.weight", hd);
  head_rms_norm(norm_q, a.q.data(), S, H, eps, a.head_norm, cx);
  head_rms_norm(norm_k, a.k.data(), S, H, eps, a.head_norm, cx);
  // O = softmax(RoPE(Q) RoPE(K)ᵀ / √128) V                                       [S, D]
  attention(rope, a, kv, cx);

  // Per row chunk: S += gate ⊙ to_out · [O | silu(g) ⊙ p],  [g | p] = (gate, up rows) · A
  const int64_t ld_cat = D + F;
  for (int64_t r = 0, n = 0; r < S; r += n) {
    n = a.chunk_at(r, S);
    linear_rows(a.normed.row(r), n, fused, 3 * D, 3 * D + 2 * F, a.mlp_in.data(), cx);
    copy_rows(a.attn.row(r), D, a.mlp_cat.data(), ld_cat, n, D);                  // [n, D]
    swiglu_rows(a.mlp_in.data(), F, a.mlp_cat.data() + D, ld_cat, n, cx);       // [n, F]
    linear(a.mlp_cat.data(), n, to_out, a.proj.data(), cx);                // [n, D]
    add_gated(a.stream.row(r), a.proj.data(), n, D, gate, cx);
  }
}

// RoPE on Q and K of every row, then the tiled joint attention into a.attn, image by image.
// With a K/V cache the reference pass keeps this block's rotated K and V; the steps append
// the cached ones after their own rows (the order of keys does not change softmax attention).
void Transformer::attention(const RopeTable& rope, Activations& a, const BlockKV& kv,
                            Compute& cx) {
  if (a.images == 1) {
    attend_one(rope, a.q.data(), a.k.data(), a.v.data(), a.attn.data(), a.cached_rows, kv, cx);
    return;
  }
  // A batch: image b's rows are gathered into one joint sequence [text | image], attended
  // exactly as one image alone, and its output scattered back.
  const int64_t D = config_.inner_dim(), T = a.layout.text_tokens, N = a.layout.image_tokens();
  check(!kv.keep_keys, "transformer: the reference pass is one image");
  auto gather = [&](const Tensor& all, Tensor& one, int64_t b) {
    copy_rows(all.row(a.text_row(b)), D, one.row(0), D, T, D);
    copy_rows(all.row(a.image_row(b)), D, one.row(T), D, N, D);
  };
  for (int64_t b = 0; b < a.images; ++b) {
    gather(a.q, a.one_q, b);
    gather(a.k, a.one_k, b);
    gather(a.v, a.one_v, b);
    attend_one(rope, a.one_q.data(), a.one_k.data(), a.one_v.data(), a.one_attn.data(),
               a.cached_rows, kv, cx);
    copy_rows(a.one_attn.row(0), D, a.attn.row(a.text_row(b)), D, T, D);
    copy_rows(a.one_attn.row(T), D, a.attn.row(a.image_row(b)), D, N, D);
  }
}

// One image's attention: q [S, D], k and v [S + cached_rows, D] (the cached rows are filled
// here), out [S, D].
void Transformer::attend_one(const RopeTable& rope, float* q, float* k, float* v, float* out,
                             int64_t cached_rows, const BlockKV& kv, Compute& cx) {
  const int64_t D = config_.inner_dim(), H = config_.num_heads, S = rope.tokens();
  rope.apply(q, D, 0, S, H, cx);
  rope.apply(k, D, 0, S, H, cx);
  int64_t kv_len = S;
  if (kv.keep_keys) {
    *kv.keep_keys = Tensor({S, D});
    *kv.keep_values = Tensor({S, D});
    std::memcpy(kv.keep_keys->data(), k, size_t(S * D) * sizeof(float));
    std::memcpy(kv.keep_values->data(), v, size_t(S * D) * sizeof(float));
  }
  if (kv.keys) {
    const int64_t R = kv.keys->dim(0);
    check(R == cached_rows, "transformer: ", R, " cached reference rows, the activations "
          "hold ", cached_rows);
    std::memcpy(k + S * D, kv.keys->data(), size_t(R * D) * sizeof(float));
    std::memcpy(v + S * D, kv.values->data(), size_t(R * D) * sizeof(float));
    kv_len += R;
  }
  ops::AttentionParams p;
  p.q_len = S;
  p.kv_len = kv_len;
  p.heads = p.kv_heads = H;
  p.head_dim = config_.head_dim;
  p.scale = float(1.0 / std::sqrt(double(config_.head_dim)));
  ops::attention(q, D, k, D, v, D, out, D, p, cx);
}

// A block that produced NaN or Inf is named (the unit), instead of a flat image at the end.
void Transformer::check_stream(const Activations& a, int64_t n, int64_t block, Compute& cx) const {
  if (!ops::all_finite(a.stream.data(), n, cx))
    ops::require_finite(a.stream.data(), n, "the output of " + block_units_[size_t(block)], cx);
}

// Block `index` (double blocks first) on the activations, its unit acquired while the next
// one is read ahead (and checked, paged): after the last block the first, which the next
// forward (the next step, or guidance's second pass) starts with. After the last forward of
// a generation that read-ahead goes unused; releasing the transformer drops it.
// A block that produced NaN or Inf is named.
void Transformer::run_block(int64_t index, const Modulation& mod, const RopeTable& rope,
                            Activations& a, const BlockKV& kv, Compute& cx) {
  cx.stop_if_cancelled();
  const int64_t blocks = int64_t(block_units_.size());
  UnitRef unit = store_.acquire(block_units_[size_t(index)]);
  store_.prefetch(block_units_[size_t((index + 1) % blocks)]);
  if (index < config_.num_double_blocks)
    double_block(*unit, mod, rope, a, kv, cx);
  else
    single_block(*unit, mod, rope, a, kv, cx);
  check_stream(a, a.rows() * config_.inner_dim(), index, cx);
}

ReferenceKV Transformer::cache_references(const Tensor& references,
                                          std::span<const LatentGrid> grids,
                                          const Modulation& at_zero, Compute& cx) {
  const int64_t D = config_.inner_dim();
  TokenLayout layout;
  layout.text_tokens = 0;
  layout.references.assign(grids.begin(), grids.end());
  const int64_t R = layout.reference_tokens();
  check(R > 0 && references.shape() == Shape{R, D}, "reference K/V cache: embedded references "
        "are ", shape_str(references.shape()), ", expected ", shape_str({R, D}));
  check(at_zero.temb.numel() == D, "transformer: modulation built for another configuration");
  const RopeTable rope(joint_position_ids(layout), config_.rope_axes, config_.rope_theta);
  Activations a(config_, layout);
  copy_rows(references.data(), D, a.stream.data(), D, R, D);
  ReferenceKV cache;
  cache.tokens = R;
  cache.keys.resize(block_units_.size());
  cache.values.resize(block_units_.size());
  for (int64_t i = 0; i < int64_t(block_units_.size()); ++i) {
    BlockKV kv;
    kv.keep_keys = &cache.keys[size_t(i)];
    kv.keep_values = &cache.values[size_t(i)];
    run_block(i, at_zero, rope, a, kv, cx);
  }
  return cache;
}

void Transformer::forward(const float* latents, const Tensor& text, const Tensor* references,
                          const Modulation& mod, const RopeTable& rope, Activations& a,
                          float* velocity, Compute& cx, const Observer& observe,
                          const ReferenceKV* cached) {
  const Lane lane{latents, &text, velocity};
  forward(std::span<const Lane>(&lane, 1), references, mod, rope, a, cx, observe, cached);
}

void Transformer::forward(std::span<const Lane> lanes, const Tensor* references,
                          const Modulation& mod, const RopeTable& rope, Activations& a,
                          Compute& cx, const Observer& observe, const ReferenceKV* cached) {
  const TokenLayout& L = a.layout;
  const int64_t D = config_.inner_dim(), T = L.text_tokens, N_img = L.target_tokens(),
                N_ref = L.reference_tokens(), N = N_img + N_ref, S = T + N;
  const int64_t B = int64_t(lanes.size());
  check(B >= 1 && B == a.images, "transformer: ", B, " images given to activations planned "
        "for ", a.images);
  check(!observe || B == 1, "transformer: an observer sees one image's forward, not a batch");
  // Checked without building strings unless they fail (this runs every step).
  const auto is_rows = [D](const Tensor& t, int64_t rows) {
    return t.shape().size() == 2 && t.dim(0) == rows && t.dim(1) == D;
  };
  for (const Lane& lane : lanes)
    if (!lane.text || !is_rows(*lane.text, T))
      fail("transformer: embedded text is ",
           lane.text ? shape_str(lane.text->shape()) : std::string("missing"), ", expected ",
           shape_str({T, D}), " (embed_text of a ", T, "-token context)");
  if (N_ref != 0 && !(references && is_rows(*references, N_ref)))
    fail("transformer: embedded references are ",
         references ? shape_str(references->shape()) : std::string("missing"), ", expected ",
         shape_str({N_ref, D}));
  check(rope.tokens() == S && rope.head_dim() == config_.head_dim, "transformer: RoPE table for ",
        rope.tokens(), " tokens, the layout has ", S);
  check(mod.temb.numel() == D, "transformer: modulation built for another configuration");
  check(!cached || (N_ref == 0 && cached->keys.size() == block_units_.size() &&
                    cached->tokens == a.cached_rows),
        "transformer: the reference K/V cache does not fit this layout and these activations");
  auto report = [&](std::string_view name, const float* data, std::initializer_list<int64_t> shape) {
    if (observe) observe(name, data, Shape(shape));
  };

  // Stream rows of each image [text | target | references] (at its rows of the batch): the
  // σ-independent embeddings are copies.
  if (!x_embedder_ || !proj_out_) keep_io_weights();
  for (int64_t b = 0; b < B; ++b) {
    const Lane& lane = lanes[size_t(b)];
    const int64_t x0 = a.image_row(b);
    copy_rows(lane.text->data(), D, a.stream.row(a.text_row(b)), D, T, D);   // C  [T, D]
    linear(lane.latents, N_img, x_embedder_->weight, a.stream.row(x0), cx);  // X  [N_img, D]
    if (N_ref > 0) copy_rows(references->data(), D, a.stream.row(x0 + N_img), D, N_ref, D);
  }
  report("x_embedder", a.stream.row(T), {N, D});

  // The blocks, one weight unit resident at a time while the next one is brought in.
  const int64_t n_double = config_.num_double_blocks, n_single = config_.num_single_blocks;
  for (int64_t i = 0; i < n_double + n_single; ++i) {
    BlockKV kv;
    if (cached) {
      kv.keys = &cached->keys[size_t(i)];
      kv.values = &cached->values[size_t(i)];
    }
    run_block(i, mod, rope, a, kv, cx);
    if (observe && i < n_double) {
      const std::string name = "transformer_blocks." + std::to_string(i);
      report(name + ".txt", a.stream.row(0), {T, D});
      report(name + ".img", a.stream.row(T), {N, D});
    } else if (observe) {
      report("single_transformer_blocks." + std::to_string(i - n_double), a.stream.data(), {S, D});
    }
  }

  // Output, target rows only (reference rows would be discarded), image by image:
  // v = proj_out · ((1 + scale_o) ⊙ LN(Z) + shift_o)                             [N_img, out]
  const Weight& proj_out = proj_out_->weight;
  const float *scale_o = mod.out.data(), *shift_o = scale_o + D;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t x0 = a.image_row(b);
    ops::modulated_layer_norm(a.stream.row(x0), a.normed.row(x0), N_img, D, float(config_.eps),
                              scale_o, shift_o, cx);
    report("norm_out", a.normed.row(x0), {N_img, D});
    linear(a.normed.row(x0), N_img, proj_out, lanes[size_t(b)].velocity, cx);
  }
}

// --- work ----------------------------------------------------------------------------------

ops::ForwardWork forward_work(const TransformerConfig& c, const TokenLayout& layout,
                              int64_t cached_rows) {
  const double D = double(c.inner_dim()), F = double(c.mlp_hidden());
  const double S = double(layout.total_tokens()), keys = S + double(cached_rows);
  const double target = double(layout.target_tokens());
  // One row through a block's weights: Q, K, V and the output (4 D²), the MLP's gate|up and
  // down (3 F D). The same for a double block's stream and a single block's fused form.
  const double per_row = 4 * D * D + 3 * F * D;
  const double blocks = double(c.num_double_blocks + c.num_single_blocks);
  ops::ForwardWork w;
  w.linear_macs = blocks * S * per_row;
  // The timestep (and guidance) embedding and the modulation vectors: one row each.
  const double embedders = c.guidance_embeds ? 2 : 1;
  w.linear_macs += embedders * (double(c.timestep_channels) * D + D * D);
  w.linear_macs += (6 + 6 + 3 + 2) * D * D;
  w.linear_macs += target * double(c.in_channels) * D + target * D * double(c.out_channels);
  w.attention_macs = blocks * 2 * S * keys * D;  // Q·Kᵀ and P·V
  return w;
}

}  // namespace klein::flux2
