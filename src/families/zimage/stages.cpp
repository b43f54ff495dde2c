// The Z-Image stages (diffusers ZImagePipeline; ZImageImg2ImgPipeline and
// ZImageInpaintPipeline with an init image, and a mask):
//
//   prompt → chat template (no think block) → tokens (≤ 512) → Qwen3 layers 1..N-1 → the
//   valid tokens' features [T, hidden]; the negative prompt too when guidance > 0
//   seed or --noise → latents [16, H/8, W/8]
//   for each σ: model time (1000 − σ·1000)/1000 → transformer (positive, and negative where
//   CFG applies) → guided velocity → Euler step
//   latents / scaling_factor + shift_factor → the FLUX.1 VAE decoder → pixels
//
// From an init image (its own size floored to 16): VAE posterior sample (mean + std · ε) →
// (z − shift)·scaling → noised to the σ of the first step that runs (strength) → the last
// steps of the same loop; inpainting puts the kept part back after every step
// (models/zimage/sampler.h).
//
// The maths is in models/zimage; this file runs it through the Session's phases (timed, with
// progress, cancellation and --dump) and refuses what ZImagePipeline does not do.
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/npy.h"
#include "families/zimage/controlnet.h"
#include "families/zimage/prompt.h"
#include "families/zimage/stages.h"
#include "formats/image/canny.h"
#include "formats/image/image.h"
#include "formats/image/preprocess.h"
#include "formats/image/resize.h"
#include "models/qwen3/prompt_cache.h"
#include "models/qwen3/text_encoder.h"
#include "models/vae/vae.h"
#include "models/zimage/checkpoint/config.h"
#include "models/zimage/checkpoint/units.h"
#include "models/zimage/controlnet.h"
#include "models/zimage/latents.h"
#include "models/zimage/sampler.h"
#include "models/zimage/step_cache.h"
#include "models/zimage/transformer.h"
#include "pipeline/dump.h"
#include "pipeline/memory_plan.h"
#include "pipeline/noise.h"
#include "pipeline/preview.h"
#include "pipeline/stages.h"

namespace klein {

namespace {

constexpr int64_t kDefaultSide = 1024;   // the pipeline's default size
constexpr int64_t kPixelsPerToken = 16;  // VAE 8 x patch 2: sizes are multiples of 16
constexpr int64_t kPixelsPerLatent = 8;
// Z-Image-Turbo as the pipeline's own example runs it: 8 steps (8 transformer calls; the
// model card's "9 steps" counts the final σ = 0), no guidance. The base model (--variant
// zimage): the pipeline's own defaults, 50 steps with guidance 5.
constexpr int64_t kTurboSteps = 8, kBaseSteps = 50;
constexpr float kTurboGuidance = 0.0f, kBaseGuidance = 5.0f;
// The ControlNet pipelines' controlnet_conditioning_scale.
constexpr float kDefaultControlScale = 0.75f;

struct State final : Generation::FamilyState {
  zimage::TransformerConfig transformer;
  zimage::Guidance guidance;
  zimage::Schedule schedule;  // the steps that run (for an init image, the last ones)
  // Image-to-image and inpainting.
  Tensor init_pixels;          // [3, H, W] in [-1, 1], encoded by prepare_latents
  Tensor vae_noise;            // ε of the init image's posterior sample: --vae-noise, else seed
  int64_t first_step = 0;      // steps of the full schedule skipped
  bool inpaint = false;
  std::vector<float> mask_pixels;  // [H·W], 1 repaints
  std::vector<float> mask_latent;  // [h·w]: the mask at latent size
  Tensor image_latents;        // from prepare_latents: the init image's latents, for the blend
  Tensor blend_noise;          // and the noise its kept part is re-noised with
  std::optional<double> step_cache;  // FirstBlockCache's threshold
  // ControlNet (the ControlNet pipelines; inpainting with one when init_image and mask).
  std::shared_ptr<zimage::ControlModel> control;
  float control_scale = kDefaultControlScale;
  Image control_source, init_source;  // as read, until the size is settled
  Tensor control_pixels;        // [3, H, W] in [-1, 1]
  Tensor masked_init_pixels;    // inpainting: the init image where the mask keeps, 0 elsewhere
  std::vector<float> keep_latent;  // inpainting: 1 - mask at latent size (1: keep)
  Tensor control_context;       // [control_in_dim, h, w], from prepare_latents
};

State& state_of(Generation& g) { return static_cast<State&>(*g.family); }

zimage::TransformerConfig transformer_config(const ModelConfig& config) {
  return zimage::parse_transformer_config(config.family_transformer,
                                          config.name + " (transformer configuration)");
}
zimage::TransformerConfig transformer_config(const WeightStore& weights) {
  return transformer_config(weights.config());
}

// The decoder's input for the final latents: the FLUX.1 VAE's scaling and shift.
Tensor decoder_input(const WeightStore& weights, const Tensor& latents) {
  const VaeConfig& config = weights.config().vae;
  return zimage::decoder_input(
      latents, zimage::LatentScale{float(config.scaling_factor), float(config.shift_factor)});
}

// Refuses an option ZImagePipeline has no counterpart for, naming it.
void refuse(bool given, const char* option, const char* why) {
  check(!given, option, ": not available with Z-Image (", why, ")");
}

// The denoising phases for the memory plan. Set-up: the captions through the context
// refiner with the shared unit (the caption embedder) held. Steps: the shared unit (the
// embedders and the final layer, read every step) and the blocks, two at a time when paged;
// the buffers of one sequence per context (zimage::Activations, captions at their 512-token
// maximum), the latents (noise, x, x before the step, velocity, both predictions) and the
// contexts. With a control model (`control_bytes` of weights, 0: none): its weights, every step
// (its file's pages stay mapped in), and its streams per context (zimage::ControlActivations).
std::pair<PhaseNeed, PhaseNeed> denoise_need(const zimage::TransformerConfig& c,
                                             const WeightStore& store, const MemoryPlanInputs& in,
                                             uint64_t control_bytes = 0, bool step_cache = false) {
  UnitSizes refiners, blocks;
  for (int64_t i = 0; i < c.n_refiner_layers; ++i) {
    refiners.add(store.unit_bytes(zimage::context_refiner_unit(i)));
    blocks.add(store.unit_bytes(zimage::context_refiner_unit(i)));
    blocks.add(store.unit_bytes(zimage::noise_refiner_unit(i)));
  }
  for (int64_t i = 0; i < c.n_layers; ++i) blocks.add(store.unit_bytes(zimage::layer_unit(i)));
  const uint64_t shared = store.unit_bytes("transformer.shared");
  PhaseNeed setup{"denoise set-up"}, steps{"denoise"};
  setup.weights_paged = shared + refiners.two_largest();
  setup.weights_resident = shared + refiners.total;
  setup.weights_one_unit = shared + refiners.largest;
  steps.weights_paged = shared + blocks.two_largest();
  steps.weights_resident = shared + blocks.total;
  steps.weights_one_unit = shared + blocks.largest;
  const int64_t contexts = in.guided ? 2 : 1;
  const int64_t h = in.height / kPixelsPerLatent, w = in.width / kPixelsPerLatent;
  const zimage::SequenceLayout layout{h, w, in.text_tokens, c.patch};
  const uint64_t activations =
      uint64_t(contexts) * zimage::Activations::plan_bytes(c, layout) +
      uint64_t(6 * c.in_channels * h * w + contexts * in.text_tokens * c.cap_feat_dim) *
          sizeof(float);
  setup.activations = steps.activations = activations;
  // Step caching keeps three [rows, D] tensors per sequence (zimage::FirstBlockCache).
  if (step_cache) steps.activations += zimage::FirstBlockCache::plan_bytes(c, layout, contexts);
  if (control_bytes > 0) {
    steps.weights_paged += control_bytes;
    steps.weights_resident += control_bytes;
    steps.weights_one_unit += control_bytes;
    steps.activations +=
        uint64_t(contexts) * zimage::ControlActivations::plan_bytes(c, layout);
  }
  return {setup, steps};
}

// The positive prediction as denoise makes it at this step, negated: the velocity of a run
// without guidance. The caption goes through its embedder and the context refiner once, in
// the first forward (once per prompt, as in a generation); every forward then runs what a
// step runs (the timestep's modulation input, the noise refiner and the main layers). Block
// outputs are shown on their real rows: the noise refiner's image tokens, the context
// refiner's caption tokens (first forward), the main layers' image then caption tokens.
class ZImageProbe final : public FamilyStages::Probe {
 public:
  ZImageProbe(WeightStore& store, const ProbeInputs& in, Compute& cx)
      : in_(in),
        cx_(cx),
        config_(transformer_config(store)),
        model_(store, config_),
        act_(config_, {in.latents->dim(1), in.latents->dim(2), in.context->dim(0), config_.patch}) {
  }

  Tensor forward(const BlockObserver& observe) override {
    const zimage::SequenceLayout& l = act_.layout;
    const int64_t D = config_.dim, n = config_.n_refiner_layers;
    zimage::Observer blocks;
    if (observe)
      blocks = [&](std::string_view name, const float* data, const Shape&) {
        auto index = [&](std::string_view prefix) -> int64_t {
          if (!name.starts_with(prefix)) return -1;
          return std::stoll(std::string(name.substr(prefix.size())));
        };
        if (const int64_t i = index("noise_refiner_"); i >= 0) {
          observe(size_t(i), 0, data, l.image_tokens() * D);
        } else if (const int64_t i = index("context_refiner_"); i >= 0) {
          observe(size_t(n + i), 0, data, l.caption * D);
        } else if (const int64_t i = index("layers_"); i >= 0) {
          observe(size_t(2 * n + i), 0, data, l.image_tokens() * D);
          observe(size_t(2 * n + i), l.image_tokens() * D, data + l.image_rows() * D,
                  l.caption * D);
        }
      };
    if (!captioned_) {
      model_.embed_caption(*in_.context, act_, cx_, blocks);
      captioned_ = true;
    }
    const Tensor adaln = model_.embed_timestep(zimage::model_time(in_.timestep), cx_);
    Tensor velocity = model_.forward(*in_.latents, adaln, act_, cx_, blocks);
    for (int64_t i = 0; i < velocity.numel(); ++i) velocity.data()[i] = -velocity.data()[i];
    return velocity;
  }

 private:
  const ProbeInputs& in_;
  Compute& cx_;
  zimage::TransformerConfig config_;
  zimage::Transformer model_;
  zimage::Activations act_;
  bool captioned_ = false;
};

class ZImageStages final : public FamilyStages {
 public:
  MemoryPlanInputs memory_inputs(const ModelConfig& config) const override {
    return memory_inputs(transformer_config(config));
  }
  // `control`: the generation's control model, if any.
  static MemoryPlanInputs memory_inputs(const zimage::TransformerConfig& transformer,
                                        const zimage::ControlModel* control = nullptr,
                                        bool step_cache = false) {
    MemoryPlanInputs in;
    in.text_tokens = zimage::kMaxPromptTokens;  // the captions' max_sequence_length
    in.context_width = transformer.cap_feat_dim;
    uint64_t control_bytes = 0;
    if (control)
      for (const std::string& unit : control->units)
        control_bytes += control->store->unit_bytes(unit);
    in.denoise = [transformer, control_bytes, step_cache](const WeightStore& store,
                                                          const MemoryPlanInputs& in) {
      return denoise_need(transformer, store, in, control_bytes, step_cache);
    };
    return in;
  }
  Capabilities capabilities(const ModelConfig& config) const override {
    Capabilities c;
    c.guidance = c.negative_prompt = c.guidance_options = c.loras = true;
    c.image_to_image = c.control = c.step_cache = true;
    c.default_steps = config.is_distilled ? kTurboSteps : kBaseSteps;
    c.default_guidance = config.is_distilled ? kTurboGuidance : kBaseGuidance;  // Turbo: 0, off
    return c;
  }
  void start(Session& session, Generation& g, Progress& progress) const override {
    const GenerateOptions& o = g.options;
    WeightStore& weights = session.weights();
    refuse(!o.references.empty(), "--reference",
           "its pipelines take no reference images; --init-image starts from a picture");
    auto state = std::make_shared<State>();
    state->transformer = transformer_config(weights);
    // LoRAs: every file read and checked against this transformer before any other work.
    if (!o.loras.empty())
      session.timed(g, progress, "load LoRA", 0, [&](Phase&) {
        g.adapters = std::make_shared<const Adapters>(Adapters::load(o.loras, weights.config()));
      });
    check(!o.control_image.empty() || o.controlnet.empty(),
          "--controlnet needs --control-image (the picture it follows)");
    check(!o.control_scale || !o.control_image.empty(), "--control-scale needs --control-image");
    check(!o.control_canny || !o.control_image.empty(),
          "--control-preprocess needs --control-image (the picture to take edges from)");
    check(o.mask.empty() || !o.init_image.empty(),
          "--mask needs --init-image (the picture the mask applies to)");
    if (o.step_cache) {
      check(std::isfinite(*o.step_cache) && *o.step_cache >= 0,
            "--cache first-block:T: expected a threshold of 0 or more, got ", *o.step_cache);
      check(o.control_image.empty(),
            "--cache: not with --control-image (the control model's hints are added after the "
            "layers a cached step skips)");
      state->step_cache = o.step_cache;
    }
    if (o.control_image.empty())
      load_init_image(session, g, progress, *state);
    else
      load_control_inputs(session, g, progress, *state);
    settle_size(session, g, progress, *state);
    settle_steps(g, weights.config(), *state);
    settle_guidance_and_noise(session, g, progress, *state);
    // The official cache compares whole batches: a step that drops the negative prompt
    // (--cfg-truncation) would compare one sequence with two.
    if (state->step_cache && g.guided)
      for (int64_t i = 0; i < state->schedule.steps(); ++i)
        check(zimage::guided_at(state->guidance, state->schedule, i),
              "--cache with --cfg-truncation ", state->guidance.truncation, ": step ", i + 1,
              " runs without guidance, and step caching compares the same batch at every step "
              "(raise --cfg-truncation to 1, or leave out --cache)");
    plan_memory_and_scratch(session, g, progress, *state);
    g.family = std::move(state);
  }

  // Image-to-image and inpainting (ZImageImg2ImgPipeline, ZImageInpaintPipeline): the init
  // image at its own size floored to multiples of 16 (scaled to it, Lanczos, as the image
  // processor does when the size differs), which is the output's size.
  static void load_init_image(Session& session, Generation& g, Progress& progress, State& st) {
    const GenerateOptions& o = g.options;
    check(!o.strength || !o.init_image.empty(),
          "--strength needs --init-image (the picture whose content it keeps)");
    check(o.vae_noise_file.empty() || !o.init_image.empty(),
          "--vae-noise needs --init-image (it is the noise of the init image's encoding)");
    if (o.init_image.empty()) return;
    st.inpaint = !o.mask.empty();
    // The pipelines' defaults: 0.6 for image-to-image, 1 for inpainting.
    const double strength = o.strength.value_or(st.inpaint ? 1.0 : 0.6);
    check(std::isfinite(strength) && strength > 0 && strength <= 1,
          "strength: expected a number in (0, 1], got ", strength);
    g.result.strength = strength;
    Image image;
    session.timed(g, progress, "load init image", 0,
                  [&](Phase&) { image = load_image(o.init_image); });
    const int width = image.width - image.width % int(kPixelsPerToken);
    const int height = image.height - image.height % int(kPixelsPerToken);
    check(width >= kPixelsPerToken && height >= kPixelsPerToken, o.init_image.string(), ": ",
          image.width, "x", image.height, " is too small for an init image (at least 16x16 pixels)");
    check((o.width <= 0 || o.width == width) && (o.height <= 0 || o.height == height),
          "Z-Image's image-to-image keeps the init image's size, ", width, "x", height,
          " (its own size floored to multiples of 16); -W/-H ask for ", o.width, "x", o.height);
    if (image.width != width || image.height != height)
      image = resize_lanczos(image, width, height);
    st.init_pixels = image_to_tensor(image);
  }

  // The ControlNet pipelines: the control model (checked against this transformer), the control
  // image, and for inpainting the init image and mask, each read now (scaled to the output size
  // once it is settled).
  static void load_control_inputs(Session& session, Generation& g, Progress& progress, State& st) {
    const GenerateOptions& o = g.options;
    check(o.init_image.empty() || !o.mask.empty(),
          "--control-image with --init-image needs --mask: the control pipelines take an init "
          "image only to inpaint (ZImageControlNetInpaintPipeline)");
    check(!o.strength, "--strength: the ControlNet pipelines run every step (no strength)");
    check(o.vae_noise_file.empty(),
          "--vae-noise: the ControlNet pipelines encode the images' means, which draw no noise");
    st.control_scale = o.control_scale.value_or(kDefaultControlScale);
    check(std::isfinite(st.control_scale), "--control-scale: expected a number, got ",
          st.control_scale);
    // --controlnet, else the one the container holds beside the model.
    session.timed(g, progress, "load control model", 0, [&](Phase&) {
      if (!o.controlnet.empty())
        st.control = std::make_shared<zimage::ControlModel>(
            zimage::open_control_model(o.controlnet, st.transformer));
      else if (auto stored = zimage::stored_control_model(session.weights(), st.transformer))
        st.control = std::make_shared<zimage::ControlModel>(std::move(*stored));
    });
    check(st.control != nullptr,
          "--control-image: no control model (give --controlnet PATH, or a container that holds "
          "one: klein convert --controlnet PATH)");
    check(o.mask.empty() || st.control->config.in_channels ==
                                2 * st.transformer.in_channels + 1,
          "--mask with --control-image: the control model ", st.control->path.string(), " takes ",
          st.control->config.in_channels, " control channels; inpainting needs ",
          2 * st.transformer.in_channels + 1, " (control, mask and masked-image latents: Union 2.1)");
    session.timed(g, progress, "load control image", 0, [&](Phase&) {
      st.control_source = load_image(o.control_image);
      if (o.control_canny)
        st.control_source =
            canny_edges(st.control_source, o.control_canny->first, o.control_canny->second);
      if (!o.init_image.empty()) st.init_source = load_image(o.init_image);
    });
    st.inpaint = !o.mask.empty();
  }

  // The output size and the token grid; for inpainting the mask at that size.
  static void settle_size(Session& session, Generation& g, Progress& progress, State& st) {
    const GenerateOptions& o = g.options;
    GenerateResult& r = g.result;
    const bool init = st.init_pixels.numel() > 0;
    const bool control = st.control != nullptr;
    // With a control image and no -W/-H: its size (the pipelines' default is 1024x1024; a
    // control image of the picture's size is what people give).
    const int64_t default_width = control ? st.control_source.width : kDefaultSide;
    const int64_t default_height = control ? st.control_source.height : kDefaultSide;
    int64_t width = init ? st.init_pixels.dim(2) : o.width > 0 ? o.width : default_width;
    int64_t height = init ? st.init_pixels.dim(1) : o.height > 0 ? o.height : default_height;
    settle_output_size(session, g, progress, width, height, kPixelsPerToken);
    width = r.width;
    height = r.height;
    g.grid = {height / kPixelsPerToken, width / kPixelsPerToken};
    // The RoPE positions of the image must stay within the model's axes_lens.
    const auto& lens = st.transformer.axes_lens;
    check(g.grid.rows < lens[1] && g.grid.cols < lens[2], "image size ", width, "x", height,
          " is too large for this model (", lens[1] * kPixelsPerToken, "x",
          lens[2] * kPixelsPerToken, " at most: axes_lens)");
    if (control) {
      // The image processor's preprocess(image, height, width): scaled (Lanczos) when the size
      // differs, then [-1, 1].
      auto at_size = [&](Image image) {
        if (image.width != width || image.height != height)
          image = resize_lanczos(image, int(width), int(height));
        return image_to_tensor(image);
      };
      st.control_pixels = at_size(std::move(st.control_source));
      st.control_source = Image();
      if (!st.inpaint) return;
      Tensor init_pixels = at_size(std::move(st.init_source));
      st.init_source = Image();
      Image mask;
      session.timed(g, progress, "load mask", 0, [&](Phase&) { mask = load_image(o.mask); });
      st.mask_pixels = binary_mask(mask, int(width), int(height));
      // The init image where the mask keeps (mask < 0.5), 0 where it repaints; the mask
      // channel is 1 - mask, nearest at latent size.
      const int64_t plane = width * height;
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t p = 0; p < plane; ++p)
          if (!(st.mask_pixels[size_t(p)] < 0.5f)) init_pixels.data()[c * plane + p] = 0.0f;
      st.masked_init_pixels = std::move(init_pixels);
      const int64_t h = height / kPixelsPerLatent, w = width / kPixelsPerLatent;
      st.keep_latent.resize(size_t(h * w));
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < w; ++j)
          st.keep_latent[size_t(i * w + j)] =
              1.0f - st.mask_pixels[size_t(i * kPixelsPerLatent * width + j * kPixelsPerLatent)];
      st.inpaint = false;  // no per-step blend: the control model sees the mask
      return;
    }
    if (!st.inpaint) return;
    Image mask;
    session.timed(g, progress, "load mask", 0, [&](Phase&) { mask = load_image(o.mask); });
    // The mask processor's mask (grey, scaled to the size, binarised), then nearest at latent
    // size: position (i, j) takes pixel (8i, 8j).
    st.mask_pixels = binary_mask(mask, int(width), int(height));
    const int64_t h = height / kPixelsPerLatent, w = width / kPixelsPerLatent;
    st.mask_latent.resize(size_t(h * w));
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j)
        st.mask_latent[size_t(i * w + j)] =
            st.mask_pixels[size_t(i * kPixelsPerLatent * width + j * kPixelsPerLatent)];
  }

  // The steps, their schedule, and for an init image the last ones only.
  static void settle_steps(Generation& g, const ModelConfig& config, State& st) {
    const GenerateOptions& o = g.options;
    GenerateResult& r = g.result;
    check(o.steps >= 0 && o.steps <= kMaxSteps, "steps: expected 1 to ", kMaxSteps, ", got ",
          o.steps);
    const bool turbo = config.is_distilled;
    r.steps = o.steps > 0 ? o.steps : turbo ? kTurboSteps : kBaseSteps;
    st.schedule = zimage::make_schedule(config.scheduler, r.steps);
    if (!r.strength) return;
    st.first_step = zimage::first_step(r.steps, *r.strength);
    check(st.first_step < r.steps, "strength ", *r.strength, " with ", r.steps,
          " steps runs no step: raise --strength or --steps");
    st.schedule = zimage::tail(st.schedule, st.first_step);
  }

  void settle_guidance_and_noise(Session& session, Generation& g, Progress& progress,
                                 State& st) const {
    const GenerateOptions& o = g.options;
    GenerateResult& r = g.result;
    const bool turbo = session.weights().config().is_distilled;
    zimage::Guidance& guidance = st.guidance;
    guidance.scale = o.guidance.value_or(turbo ? kTurboGuidance : kBaseGuidance);
    check(std::isfinite(guidance.scale) && guidance.scale >= 0,
          "guidance: expected a number of "
          "0 or more (Z-Image: 0 runs without classifier-free guidance), got ",
          guidance.scale);
    guidance.normalization = o.cfg_normalization.value_or(0.0f);
    check(std::isfinite(guidance.normalization) && guidance.normalization >= 0,
          "--cfg-normalization: expected a number of 0 (off) or more, got ",
          guidance.normalization);
    guidance.truncation = o.cfg_truncation.value_or(1.0f);
    check(std::isfinite(guidance.truncation), "--cfg-truncation: expected a number, got ",
          guidance.truncation);
    r.guidance = guidance.scale;
    r.no_guidance = 0;
    g.guided = r.guided = guidance.scale > 0;
    if (!g.guided && (!o.negative_prompt.empty() || o.cfg_normalization || o.cfg_truncation))
      session.warn(g, progress,
                   "guidance is 0 (no classifier-free guidance): the negative "
                   "prompt and the CFG options have no effect");

    check(o.noise_file.empty() || !o.seed,
          "--noise and --seed exclude each other: the noise "
          "file is the initial noise");
    // The init image's encoding draws noise too: from files, both are files.
    const bool init = st.init_pixels.numel() > 0;
    check(!init || o.noise_file.empty() == o.vae_noise_file.empty(),
          o.noise_file.empty()
              ? "--vae-noise needs --noise too (with a seed, the seed draws both)"
              : "--noise with --init-image needs --vae-noise too: the init image's encoding "
                "samples noise, which a seed would otherwise draw");
    const Shape latent = {1, st.transformer.in_channels, r.height / kPixelsPerLatent,
                          r.width / kPixelsPerLatent};
    if (o.noise_file.empty()) {
      r.seed = o.seed ? *o.seed : random_seed();
    } else {
      g.noise_from_file = read_noise_file(o.noise_file, latent);
      if (init) st.vae_noise = read_noise_file(o.vae_noise_file, latent, "--vae-noise");
    }
    r.fast = runs_fast(o.precision, session.weights());
  }

  void plan_memory_and_scratch(Session& session, Generation& g, Progress& progress,
                               const State& st) const {
    const GenerateOptions& o = g.options;
    GenerateResult& r = g.result;
    WeightStore& weights = session.weights();
    // The images the VAE encodes: the init image; or the control image, and for inpainting
    // with it the masked init image.
    const int encodes = st.init_pixels.numel() > 0 ? 1
                        : st.control ? (st.masked_init_pixels.numel() > 0 ? 2 : 1)
                                     : 0;
    if (o.plan_memory) {
      MemoryPlanInputs need =
          memory_inputs(st.transformer, st.control.get(), st.step_cache.has_value());
      need.width = r.width;
      need.height = r.height;
      for (int i = 0; i < encodes; ++i) need.references.emplace_back(r.width, r.height);
      need.steps = r.steps;
      need.guided = g.guided;
      need.vae_memory = o.vae_memory;
      need.adapter_bytes = g.adapters ? g.adapters->bytes() : 0;
      r.memory = plan_memory(estimate_memory(weights, need), o.max_memory, available_memory_bytes(),
                             o.residency);
      weights.set_residency(r.memory->residency);
      weights.set_read_ahead(r.memory->read_ahead);
      progress.memory_plan(*r.memory);
    }
    if (!o.plan_only) {
      const std::vector<std::pair<int64_t, int64_t>> sizes(size_t(encodes), {r.height, r.width});
      vae::check_scratch(weights.config().vae, sizes, r.height, r.width, o.vae_memory);
    }
  }

  std::string prompt_chat_text(std::string_view prompt) const override {
    return zimage::chat_text(prompt);
  }
  PromptTokens prompt_tokens(const Tokenizer& tokenizer, std::string_view prompt) const override {
    return zimage::tokenize_prompt(tokenizer, prompt);
  }
  // The real tokens only (the pipeline drops the padding rows): [real tokens, hidden].
  EncodedText encode_text(qwen3::TextEncoder& encoder, const Tokenizer& tokenizer,
                          std::string_view prompt, qwen3::PromptCache* cache,
                          const TextLayerHook& observe) const override {
    EncodedText out;
    out.tokens = prompt_tokens(tokenizer, prompt);
    const std::vector<int32_t> ids(out.tokens.ids.begin(),
                                   out.tokens.ids.begin() + out.tokens.real_tokens);
    const std::vector<int32_t> mask(ids.size(), 1);
    if (observe) {
      out.context = encoder.encode(ids, mask, observe);
      return out;
    }
    qwen3::CachedContext c = qwen3::encode_with_cache(encoder, cache, ids, mask);
    out.context = std::move(c.context);
    out.from_cache = c.from_cache;
    out.store_error = std::move(c.store_error);
    return out;
  }

  // The prompt's features: the last layer but one, valid tokens only. Float32 always, as
  // for FLUX.2-klein.
  void encode_prompt(Session& session, Generation& g, Progress& progress,
                     const TextLayerHook& on_layer) const override {
    const GenerateOptions& o = g.options;
    session.timed(g, progress, "text encoder", 0, [&](Phase& phase) {
      Compute& cx = session.compute();
      const Compute::Use exact(cx, Arithmetic::exact());
      const int passes = g.guided ? 2 : 1;
      int pass = 0;
      const Compute::Reporting layers(cx, [&](int64_t done, int64_t total) {
        phase.step(int(pass * total + done), int(passes * total));
      });
      qwen3::TextEncoder encoder(session.weights(), cx);
      std::optional<qwen3::PromptCache> cache;
      if (o.prompt_cache_dir) cache.emplace(*o.prompt_cache_dir);
      auto encode = [&](const std::string& text, bool& from_cache, const TextLayerHook& observe) {
        return encode_for(session, g, progress, encoder, cache ? &*cache : nullptr, text,
                          from_cache, observe);
      };
      g.context = encode(o.prompt, g.result.context_from_cache, on_layer);
      pass = 1;
      bool unused;
      if (g.guided) g.negative = encode(o.negative_prompt, unused, {});
    });
    session.weights().release("text_encoder.");
    const Dumper dump(o.dump_dir);
    dump.f32("prompt_embeds", g.context, {g.context.dim(0), g.context.dim(1)});
    if (g.guided)
      dump.f32("negative_prompt_embeds", g.negative, {g.negative.dim(0), g.negative.dim(1)});
  }

  // The initial latents [16, H/8, W/8]: --noise ([1, 16, H/8, W/8] float32), else drawn from
  // the seed. From an init image: its VAE posterior sample mean + std · ε (ε: --vae-noise, else
  // the seed's VAE stream), scaled as the pipeline scales latents, noised to the σ where the
  // steps start.
  void prepare_latents(Session& session, Generation& g, Progress& progress) const override {
    const GenerateOptions& o = g.options;
    State& st = state_of(g);
    const Dumper dump(o.dump_dir);
    const int64_t C = st.transformer.in_channels;
    const int64_t h = g.result.height / kPixelsPerLatent, w = g.result.width / kPixelsPerLatent;
    if (g.noise_from_file.numel() > 0) {
      g.noise = std::move(g.noise_from_file);
    } else {
      g.noise = Tensor({C, h, w});
      fill_gaussian(g.noise, *g.result.seed);
    }
    dump.f32("noise", g.noise, {1, C, h, w});
    if (st.control) prepare_control(session, g, progress, st);
    if (st.init_pixels.numel() == 0) return;

    const Shape latent = {1, C, h, w};
    dump.f32("init_pixels", st.init_pixels, {1, 3, g.result.height, g.result.width});
    if (st.inpaint) {
      dump.f32("mask_pixels", st.mask_pixels.data(), {1, 1, g.result.height, g.result.width});
      dump.f32("mask_latent", st.mask_latent.data(), {1, 1, h, w});
    }
    vae::Vae::Posterior posterior;
    session.timed(g, progress, "vae encode", 0, [&](Phase& phase) {
      const Compute::Use arithmetic(session.compute(), arithmetic_for(g.result.fast));
      const Compute::Reporting blocks(session.compute(), [&](int64_t done, int64_t total) {
        phase.step(int(done), int(total));
      });
      vae::Vae vae(session.weights(), session.compute(), o.vae_memory);
      posterior = vae.encode_posterior(st.init_pixels);
    });
    session.weights().release("vae.encoder");
    st.init_pixels = Tensor();
    check(posterior.mean.shape() == g.noise.shape(), "internal: init image latents ",
          shape_str(posterior.mean.shape()), " against noise ", shape_str(g.noise.shape()));
    Tensor& eps = st.vae_noise;
    if (eps.numel() == 0) {
      eps = Tensor(g.noise.shape());
      fill_gaussian(eps, *g.result.seed, NoiseStream::vae_sample);
    }
    dump.f32("init_latent_mean", posterior.mean, latent);
    dump.f32("init_latent_std", posterior.std, latent);
    dump.f32("vae_encode_noise0", eps, latent);
    Tensor sample(posterior.mean.shape());
    for (int64_t i = 0; i < sample.numel(); ++i)
      sample.data()[i] = posterior.mean.data()[i] + posterior.std.data()[i] * eps.data()[i];
    eps = Tensor();
    const VaeConfig& vc = session.weights().config().vae;
    Tensor image = zimage::latents_from_encoder(
        sample, zimage::LatentScale{float(vc.scaling_factor), float(vc.shift_factor)});
    dump.f32("image_latents", image, latent);
    Tensor x(g.noise.shape());
    zimage::scale_noise(image.data(), g.noise.data(), x.numel(), st.schedule.sigmas[0], x.data());
    dump.f32("latents_initial", x, latent);
    if (st.inpaint) {
      st.image_latents = std::move(image);
      st.blend_noise = std::move(g.noise);
    }
    g.noise = std::move(x);
  }

  // The control context [control_in_dim, h, w]: the control image's VAE mean, scaled as the
  // pipeline scales latents; then zeros up to control_in_dim, or for inpainting the keep mask
  // (1 - mask) and the masked init image's latents likewise.
  static void prepare_control(Session& session, Generation& g, Progress& progress, State& st) {
    const Dumper dump(g.options.dump_dir);
    const int64_t C = st.transformer.in_channels, Cin = st.control->config.in_channels;
    const int64_t H = g.result.height, W = g.result.width;
    const int64_t h = H / kPixelsPerLatent, w = W / kPixelsPerLatent;
    const bool inpaint = st.masked_init_pixels.numel() > 0;
    dump.f32("control_pixels", st.control_pixels, {1, 3, H, W});
    if (inpaint) dump.f32("masked_init_pixels", st.masked_init_pixels, {1, 3, H, W});
    Tensor control_mean, masked_mean;
    session.timed(g, progress, "vae encode", 0, [&](Phase& phase) {
      const Compute::Use arithmetic(session.compute(), arithmetic_for(g.result.fast));
      const int n = inpaint ? 2 : 1;
      int i = 0;
      const Compute::Reporting blocks(session.compute(), [&](int64_t done, int64_t total) {
        phase.step(int(i * total + done), int(n * total));
      });
      vae::Vae vae(session.weights(), session.compute(), g.options.vae_memory);
      control_mean = vae.encode_mean(st.control_pixels);
      ++i;
      if (inpaint) masked_mean = vae.encode_mean(st.masked_init_pixels);
    });
    session.weights().release("vae.encoder");
    st.control_pixels = Tensor();
    st.masked_init_pixels = Tensor();
    dump.f32("control_latent_mean", control_mean, {1, C, h, w});
    if (inpaint) dump.f32("masked_init_latent_mean", masked_mean, {1, C, h, w});
    const VaeConfig& vc = session.weights().config().vae;
    const zimage::LatentScale scale{float(vc.scaling_factor), float(vc.shift_factor)};
    st.control_context = Tensor({Cin, h, w});
    float* ctx = st.control_context.data();
    std::fill(ctx, ctx + st.control_context.numel(), 0.0f);
    const Tensor control = zimage::latents_from_encoder(control_mean, scale);
    std::memcpy(ctx, control.data(), size_t(control.numel()) * sizeof(float));
    if (inpaint) {
      std::memcpy(ctx + C * h * w, st.keep_latent.data(), size_t(h * w) * sizeof(float));
      const Tensor masked = zimage::latents_from_encoder(masked_mean, scale);
      std::memcpy(ctx + (C + 1) * h * w, masked.data(), size_t(masked.numel()) * sizeof(float));
    }
    dump.f32("control_context", st.control_context, {1, Cin, 1, h, w});
  }

  void denoise(Session& session, Generation& g, Progress& progress,
               const StepHook& on_step) const override {
    State& st = state_of(g);
    GenerateResult& r = g.result;
    const Dumper dump(g.options.dump_dir);
    session.timed(g, progress, "denoise", int(r.steps), [&](Phase& phase) {
      Compute& cx = session.compute();
      const Compute::Use arithmetic(cx, arithmetic_for(r.fast));
      const auto setup_start = std::chrono::steady_clock::now();
      zimage::Transformer model(session.weights(), st.transformer, g.adapters.get());
      Tensor x = std::move(g.noise);
      const int64_t H = x.dim(1), W = x.dim(2);
      zimage::Activations positive(st.transformer, {H, W, g.context.dim(0), st.transformer.patch});
      model.embed_caption(g.context, positive, cx);
      std::unique_ptr<zimage::Activations> negative;
      if (g.guided) {
        negative = std::make_unique<zimage::Activations>(
            st.transformer, zimage::SequenceLayout{H, W, g.negative.dim(0), st.transformer.patch});
        model.embed_caption(g.negative, *negative, cx);
      }
      // The control model beside the transformer: its context embedded once per sequence.
      std::unique_ptr<zimage::ControlNet> control;
      std::unique_ptr<zimage::ControlActivations> control_positive, control_negative;
      if (st.control) {
        control = std::make_unique<zimage::ControlNet>(*st.control->store, st.control->config,
                                                       model);
        control_positive =
            std::make_unique<zimage::ControlActivations>(st.transformer, positive.layout);
        control->embed_control(st.control_context, *control_positive, positive, cx);
        if (negative) {
          control_negative =
              std::make_unique<zimage::ControlActivations>(st.transformer, negative->layout);
          control->embed_control(st.control_context, *control_negative, *negative, cx);
        }
        st.control_context = Tensor();
      }
      // One forward, with the control model's hints when there is one.
      auto forward = [&](const Tensor& latents, const Tensor& adaln, zimage::Activations& act,
                         zimage::ControlActivations* ca) {
        if (!control) return model.forward(latents, adaln, act, cx);
        control->start_forward(latents, adaln, st.control_scale, *ca, act, cx);
        return model.forward(latents, adaln, act, cx, {}, [&](int64_t layer, float* stream) {
          control->add_hints(layer, stream, *ca, act, cx);
        });
      };
      // Step caching: the batch of every call, the prompt's sequence (and the negative's).
      std::optional<zimage::FirstBlockCache> cache;
      std::vector<zimage::Activations*> batch{&positive};
      if (st.step_cache) {
        cache.emplace(*st.step_cache);
        if (negative) batch.push_back(negative.get());
      }
      r.denoise_setup_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();
      const zimage::Schedule& s = st.schedule;
      Tensor v(x.shape()), x_in(x.shape());
      Tensor proper;  // inpainting's blend target
      if (st.inpaint) proper = Tensor(x.shape());
      for (int64_t i = 0; i < s.steps(); ++i) {
        cx.stop_if_cancelled();
        cx.level_arenas();
        const auto step_start = std::chrono::steady_clock::now();
        std::memcpy(x_in.data(), x.data(), size_t(x.numel()) * sizeof(float));
        const Tensor adaln = model.embed_timestep(s.model_time(i), cx);
        const bool guided = g.guided && zimage::guided_at(st.guidance, s, i);
        Tensor pos, neg;
        if (cache) {
          std::vector<Tensor> out = cache->forward(model, x, adaln, batch, cx);
          pos = std::move(out[0]);
          if (guided) neg = std::move(out[1]);
        } else {
          pos = forward(x, adaln, positive, control_positive.get());
          if (guided) neg = forward(x, adaln, *negative, control_negative.get());
        }
        zimage::velocity(pos.data(), guided ? neg.data() : nullptr, pos.numel(), st.guidance,
                         v.data());
        const float sigma = s.sigmas[size_t(i)];
        zimage::euler_step(x.data(), v.data(), x.numel(), sigma, s.sigmas[size_t(i + 1)]);
        if (st.inpaint) {
          // The kept part back: the init image's latents at the next σ (clean after the last).
          if (dump.on()) dump.f32("step" + std::to_string(i) + "_latents_stepped", x,
                                  {1, x.dim(0), H, W});
          if (i + 1 < s.steps())
            zimage::scale_noise(st.image_latents.data(), st.blend_noise.data(), x.numel(),
                                s.sigmas[size_t(i + 1)], proper.data());
          else
            std::memcpy(proper.data(), st.image_latents.data(), size_t(x.numel()) * sizeof(float));
          if (dump.on()) dump.f32("step" + std::to_string(i) + "_init_latents_proper", proper,
                                  {1, x.dim(0), H, W});
          zimage::keep_unmasked(x.data(), proper.data(), st.mask_latent.data(), x.dim(0), H * W);
        }
        r.step_seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
        if (dump.on()) {
          const std::string p = "step" + std::to_string(i) + "_";
          const Shape shape = {1, x.dim(0), H, W};
          const float t = s.model_time(i);
          dump.f32(p + "t_model", &t, {1});
          dump.f32(p + "latents_in", x_in, shape);
          dump.f32(p + "velocity", v, shape);
          dump.f32(p + "latents_out", x, shape);
        }
        phase.step(int(i + 1), int(s.steps()));
        if (on_step)
          on_step(StepView{i, s.steps(), x, x_in, s.timesteps[size_t(i)], g.grid, v, sigma,
                           [&] { return flux1_step_preview(x_in, v, sigma); }});
      }
      g.latents = std::move(x);
      if (cache) r.step_cache = StepCacheResult{cache->threshold(), cache->computed(),
                                                cache->skipped()};
    });
    st.image_latents = Tensor();
    st.blend_noise = Tensor();
    st.control.reset();
    session.weights().release("transformer.");
    dump.f32("final_latents", g.latents, {1, g.latents.dim(0), g.latents.dim(1), g.latents.dim(2)});
    g.context = Tensor();
    g.negative = Tensor();
  }

  void decode(Session& session, Generation& g, Progress& progress) const override {
    const Dumper dump(g.options.dump_dir);
    WeightStore& weights = session.weights();
    Tensor decoded;
    session.timed(g, progress, "vae decode", 0, [&](Phase& phase) {
      Compute& cx = session.compute();
      const Compute::Use arithmetic(cx, arithmetic_for(g.result.fast));
      const Compute::Reporting blocks(
          cx, [&](int64_t done, int64_t total) { phase.step(int(done), int(total)); });
      const Tensor z = decoder_input(weights, g.latents);
      dump.f32("vae_input", z, {1, z.dim(0), z.dim(1), z.dim(2)});
      vae::Vae vae(weights, cx, g.options.vae_memory);
      decoded = vae.decode_latent(z);
    });
    finish_decode(session, g, std::move(decoded));
  }

  // The blocks as the forward runs them: the noise refiner (image rows), the context refiner
  // (caption rows; embed_caption runs it before the forward, the official forward after the
  // noise refiner: the two streams do not meet until the main layers), the main layers.
  std::vector<TransformerBlock> transformer_blocks(const ModelConfig& config) const override {
    const zimage::TransformerConfig c = transformer_config(config);
    std::vector<TransformerBlock> blocks;
    for (int64_t i = 0; i < c.n_refiner_layers; ++i)
      blocks.push_back({"noise_refiner." + std::to_string(i), zimage::noise_refiner_unit(i)});
    for (int64_t i = 0; i < c.n_refiner_layers; ++i)
      blocks.push_back({"context_refiner." + std::to_string(i), zimage::context_refiner_unit(i)});
    for (int64_t i = 0; i < c.n_layers; ++i)
      blocks.push_back({"layers." + std::to_string(i), zimage::layer_unit(i)});
    return blocks;
  }
  int64_t transformer_width(const ModelConfig& config) const override {
    return transformer_config(config).dim;
  }
  // The caption at its longest (512 tokens): the work of a long prompt.
  SyntheticProbe synthetic_probe(const ModelConfig& config, LatentGrid grid) const override {
    const zimage::TransformerConfig c = transformer_config(config);
    SyntheticProbe p;
    p.grid = grid;
    p.latents = Tensor({c.in_channels, grid.rows * c.patch, grid.cols * c.patch});
    p.context = Tensor({kSyntheticCaption, c.cap_feat_dim});
    fill_gaussian(p.latents, 1);
    fill_gaussian(p.context, 2);
    return p;
  }
  ops::ForwardWork forward_work(const ModelConfig& config, LatentGrid grid) const override {
    const zimage::TransformerConfig c = transformer_config(config);
    return zimage::forward_work(
        c, {grid.rows * c.patch, grid.cols * c.patch, kSyntheticCaption, c.patch});
  }
  static constexpr int64_t kSyntheticCaption = 512;

  std::unique_ptr<Probe> start_probe(WeightStore& store, const ProbeInputs& in,
                                     Compute& cx) const override {
    return std::make_unique<ZImageProbe>(store, in, cx);
  }
  Tensor decode_latents(WeightStore& store, const Tensor& latents, LatentGrid,
                        Compute& cx) const override {
    vae::Vae vae(store, cx);
    return vae.decode_latent(decoder_input(store, latents));
  }
  // TAEF1 was distilled on the FLUX.1 VAE's latents as its pipelines scale them for the
  // transformer: the sampler's latents, as they are.
  Tensor tiny_decoder_input(WeightStore&, const Tensor& latents, LatentGrid,
                            Compute&) const override {
    check(latents.shape().size() == 3, "Z-Image latents [16, h, w] expected, got ",
          shape_str(latents.shape()));
    return latents.copy();
  }
  Tensor encode_image(WeightStore& store, const Tensor& pixels, Compute& cx) const override {
    vae::Vae vae(store, cx);
    const VaeConfig& config = store.config().vae;
    return zimage::latents_from_encoder(
        vae.encode_mean(pixels),
        zimage::LatentScale{float(config.scaling_factor), float(config.shift_factor)});
  }
};

}  // namespace

const FamilyStages& zimage::stages() {
  static const ZImageStages stages;
  return stages;
}

}  // namespace klein
