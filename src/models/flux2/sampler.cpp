#include "models/flux2/sampler.h"

#include <chrono>
#include <cstring>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "ops/finite.h"

namespace klein::flux2 {

namespace {

void check_inputs(const SamplerInputs& in, const TransformerConfig& c, bool guided) {
  check(in.context != nullptr, "sampler: no prompt context");
  const Shape& ctx = in.context->shape();
  check(ctx.size() == 2 && ctx[0] > 0 && ctx[1] == c.context_dim, "prompt context: expected [",
        "tokens, ", c.context_dim, "], got ", shape_str(ctx));
  if (guided) {
    check(in.negative_context != nullptr, "sampler: classifier-free guidance needs the negative "
          "prompt's context (the embedding of \"\" by default)");
    check(in.negative_context->shape() == ctx, "negative prompt context: expected ",
          shape_str(ctx), " like the prompt context, got ",
          shape_str(in.negative_context->shape()));
  }
  check(in.target.rows > 0 && in.target.cols > 0, "sampler: empty target grid ", in.target.rows,
        "x", in.target.cols);
  check(in.noise != nullptr, "sampler: no initial noise");
  const Shape expected{in.target.tokens(), c.in_channels};
  check(in.noise->shape() == expected, "initial noise: expected packed tokens ",
        shape_str(expected), " for a ", in.target.rows, "x", in.target.cols, " latent grid, got ",
        shape_str(in.noise->shape()));
  const Schedule& s = in.schedule;
  check(s.steps() >= 1 && s.sigmas.size() == size_t(s.steps() + 1),
        "sampler: schedule has ", s.steps(), " timesteps and ", s.sigmas.size(),
        " sigmas; expected steps >= 1 and steps + 1 sigmas");
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// v ← v_u + g·(v_c − v_u), each operation rounded to float32 like the pipeline's.
void apply_guidance(float* v_cond, const float* v_uncond, int64_t n, float g) {
  for (int64_t i = 0; i < n; ++i) {
    const float difference = v_cond[i] - v_uncond[i];
    const float scaled = g * difference;
    v_cond[i] = v_uncond[i] + scaled;
  }
}

}  // namespace

Tensor pack_latents(const Tensor& chw) {
  check(chw.shape().size() == 3, "latents: expected [channels, rows, cols], got ",
        shape_str(chw.shape()));
  const int64_t C = chw.dim(0), cells = chw.dim(1) * chw.dim(2);
  Tensor tokens({cells, C});
  for (int64_t c = 0; c < C; ++c)
    for (int64_t t = 0; t < cells; ++t) tokens.data()[t * C + c] = chw.data()[c * cells + t];
  return tokens;
}

Tensor unpack_latents(const Tensor& tokens, LatentGrid grid) {
  check(tokens.shape().size() == 2 && tokens.dim(0) == grid.tokens(), "packed latents: expected [",
        grid.tokens(), ", channels] for a ", grid.rows, "x", grid.cols, " grid, got ",
        shape_str(tokens.shape()));
  const int64_t C = tokens.dim(1), cells = grid.tokens();
  Tensor chw({C, grid.rows, grid.cols});
  for (int64_t t = 0; t < cells; ++t)
    for (int64_t c = 0; c < C; ++c) chw.data()[c * cells + t] = tokens.data()[t * C + c];
  return chw;
}

bool uses_guidance(const ModelConfig& config, float guidance) {
  return !config.is_distilled && !config.transformer.guidance_embeds && guidance > 1.0f;
}

namespace {

// Image i > 0 of a batch must share everything with image 0 but its context, noise and
// callbacks.
void check_batch(std::span<const SamplerInputs> batch) {
  const SamplerInputs& first = batch[0];
  for (size_t i = 1; i < batch.size(); ++i) {
    const SamplerInputs& in = batch[i];
    const std::string who = "batch image " + std::to_string(i) + ": ";
    check(in.target.rows == first.target.rows && in.target.cols == first.target.cols, who,
          "target grid ", in.target.rows, "x", in.target.cols, ", image 0 has ",
          first.target.rows, "x", first.target.cols, " (a batch is one size)");
    check(in.schedule.sigmas == first.schedule.sigmas &&
              in.schedule.timesteps == first.schedule.timesteps,
          who, "another schedule than image 0 (a batch takes the same steps)");
    check(in.guidance == first.guidance, who, "guidance ", in.guidance, ", image 0 has ",
          first.guidance);
    check(in.adapters == first.adapters, who, "other LoRA adapters than image 0");
    check(in.references.size() == first.references.size(), who, in.references.size(),
          " references, image 0 has ", first.references.size());
    for (size_t r = 0; r < in.references.size(); ++r) {
      const Tensor* a = in.references[r].tokens;
      const Tensor* b = first.references[r].tokens;
      const bool same = a == b || (a && b && a->shape() == b->shape() &&
                                   std::memcmp(a->data(), b->data(),
                                               size_t(a->numel()) * sizeof(float)) == 0);
      check(same, who, "reference ", r, " differs from image 0's (a batch shares its references)");
    }
  }
}

}  // namespace

SamplerResult sample(WeightStore& store, const SamplerInputs& in, Compute& cx) {
  return std::move(sample_batch(store, std::span<const SamplerInputs>(&in, 1), cx)[0]);
}

std::vector<SamplerResult> sample_batch(WeightStore& store, std::span<const SamplerInputs> batch,
                                        Compute& cx) {
  check(!batch.empty(), "sampler: a batch needs at least one image");
  const SamplerInputs& in = batch[0];  // what the images share
  const int64_t B = int64_t(batch.size());
  const ModelConfig& config = store.config();
  const bool guided = uses_guidance(config, in.guidance);
  Transformer model(store, in.adapters);
  for (const SamplerInputs& one : batch) check_inputs(one, model.config(), guided);
  check_batch(batch);

  std::vector<SamplerResult> results(static_cast<size_t>(B));
  // FLUX.2-dev (guidance-distilled) gives the scale to the model at every step instead.
  const std::optional<float> embedded_guidance =
      config.transformer.guidance_embeds ? std::optional<float>(in.guidance) : std::nullopt;
  if (config.is_distilled && !embedded_guidance && in.guidance > 1.0f) {
    std::ostringstream w;
    w << "guidance " << in.guidance << " is ignored: the distilled klein model runs without "
      << "classifier-free guidance";
    for (SamplerResult& r : results) r.warnings.push_back(w.str());
  }

  // Once per generation: layout, RoPE, σ-independent embeddings, every step's modulation
  // (σ only), activation memory. Everything that reads "transformer.shared" happens here,
  // under one reference, while the first block is read ahead; then the unit is released.
  const auto setup_start = std::chrono::steady_clock::now();
  const Schedule& s = in.schedule;
  // The K/V pipeline (a checkpoint trained for it): the references leave the sequence and
  // enter every block as cached keys and values.
  const bool kv_cache = config.reference_cache && !in.references.empty();
  TokenLayout layout;
  layout.text_tokens = in.context->dim(0);
  layout.target = in.target;
  std::vector<LatentGrid> grids;
  for (const ReferenceTokens& r : in.references) grids.push_back(r.grid);
  if (!kv_cache) layout.references = grids;
  const RopeTable rope(joint_position_ids(layout), model.config().rope_axes,
                       model.config().rope_theta);
  std::vector<Tensor> text(static_cast<size_t>(B)), negative_text(static_cast<size_t>(B));
  Tensor references;
  std::vector<Modulation> mods;  // shared by both passes of CFG and by every image
  std::optional<Modulation> at_zero;  // the references' modulation in the K/V pipeline
  {
    const UnitRef shared = store.acquire("transformer.shared");
    store.prefetch(model.config().num_double_blocks > 0 ? double_block_unit(0)
                                                        : single_block_unit(0));
    for (int64_t b = 0; b < B; ++b) {
      const SamplerInputs& one = batch[size_t(b)];
      check(one.context->dim(0) == layout.text_tokens, "batch image ", b, ": a context of ",
            one.context->dim(0), " tokens, image 0 has ", layout.text_tokens);
      text[size_t(b)] = model.embed_text(*one.context, cx);
      if (guided) negative_text[size_t(b)] = model.embed_text(*one.negative_context, cx);
    }
    references = model.embed_references(in.references, cx);
    mods.reserve(size_t(s.steps()));
    for (int64_t i = 0; i < s.steps(); ++i) {
      mods.emplace_back(model.config());
      model.modulate(s.model_timestep(i), mods.back(), cx, embedded_guidance);
    }
    if (kv_cache) {
      at_zero.emplace(model.config());
      model.modulate(0.0f, *at_zero, cx, embedded_guidance);
    }
    model.keep_io_weights();
  }
  ReferenceKV cache;
  if (kv_cache) {
    cache = model.cache_references(references, grids, *at_zero, cx);
    references = Tensor();
  }
  Activations act(model.config(), layout, Activations::kDefaultChunkRows, cache.tokens, B);
  for (SamplerResult& r : results) r.activation_bytes = act.bytes() + cache.bytes();

  // Per image: its latents, velocity (and the unconditional one), the latents before a step.
  const Shape tokens = in.noise->shape();
  const int64_t n = numel(tokens);
  std::vector<Tensor> x, velocity, velocity_uncond, x_in;
  std::vector<Transformer::Lane> lanes, uncond_lanes;
  for (int64_t b = 0; b < B; ++b) {
    const SamplerInputs& one = batch[size_t(b)];
    x.emplace_back(tokens);
    velocity.emplace_back(tokens);
    velocity_uncond.emplace_back(guided ? tokens : Shape{0});
    x_in.emplace_back(one.on_step ? tokens : Shape{0});
    std::memcpy(x.back().data(), one.noise->data(), size_t(n) * sizeof(float));
  }
  for (int64_t b = 0; b < B; ++b) {
    const size_t i = size_t(b);
    lanes.push_back({x[i].data(), &text[i], velocity[i].data()});
    if (guided) uncond_lanes.push_back({x[i].data(), &negative_text[i], velocity_uncond[i].data()});
  }
  const double setup_seconds = seconds_since(setup_start);
  std::vector<double> step_seconds;
  step_seconds.reserve(size_t(s.steps()));

  for (int64_t i = 0; i < s.steps(); ++i) {
    const auto step_start = std::chrono::steady_clock::now();
    cx.level_arenas();  // from the second step on, nothing is allocated
    const float sigma = s.sigmas[size_t(i)], sigma_next = s.sigmas[size_t(i + 1)];
    const float timestep = s.model_timestep(i);
    const Modulation& mod = mods[size_t(i)];
    try {
      const ReferenceKV* kv = kv_cache ? &cache : nullptr;
      model.forward(lanes, &references, mod, rope, act, cx, {}, kv);
      if (guided) model.forward(uncond_lanes, &references, mod, rope, act, cx, {}, kv);
      for (int64_t b = 0; b < B; ++b) {
        if (guided)
          apply_guidance(velocity[size_t(b)].data(), velocity_uncond[size_t(b)].data(), n,
                         in.guidance);
        ops::require_finite(velocity[size_t(b)].data(), n,
                            B == 1 ? std::string("the velocity")
                                   : "the velocity of batch image " + std::to_string(b),
                            cx);
      }
    } catch (const ops::NonFinite& e) {
      throw ops::NonFinite("denoising step " + std::to_string(i + 1) + " of " +
                           std::to_string(s.steps()) + ": " + e.what());
    }
    for (int64_t b = 0; b < B; ++b) {
      const SamplerInputs& one = batch[size_t(b)];
      Tensor& xb = x[size_t(b)];
      if (one.on_step) std::memcpy(x_in[size_t(b)].data(), xb.data(), size_t(n) * sizeof(float));
      euler_step(xb.data(), velocity[size_t(b)].data(), n, sigma, sigma_next);
      if (one.after_update) one.after_update(i, xb);
    }
    step_seconds.push_back(seconds_since(step_start));
    for (int64_t b = 0; b < B; ++b) {
      const SamplerInputs& one = batch[size_t(b)];
      if (one.on_step)
        one.on_step(StepInfo{i, s.steps(), sigma, sigma_next, timestep, x_in[size_t(b)],
                             velocity[size_t(b)], x[size_t(b)]});
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    SamplerResult& r = results[size_t(b)];
    r.latents = std::move(x[size_t(b)]);
    r.setup_seconds = setup_seconds;
    r.step_seconds = step_seconds;
  }
  return results;
}

}  // namespace klein::flux2
