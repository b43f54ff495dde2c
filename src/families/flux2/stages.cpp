// The FLUX.2 stages (pipeline.h describes them; stages.h how a family provides them), which
// FLUX.2-klein and FLUX.2-dev share: families/flux2_klein and families/flux2_dev say what
// differs (flux2/stages.h: Flux2Pipeline).
#include <cmath>
#include <cstring>
#include <optional>
#include <string_view>

#include "core/error.h"
#include "core/memory.h"
#include "core/npy.h"
#include "families/flux2/stages.h"
#include "formats/image/preprocess.h"
#include "formats/image/resize.h"
#include "models/flux2/positions.h"
#include "models/flux2/sampler.h"
#include "models/flux2/schedule.h"
#include "models/flux2/transformer.h"
#include "models/qwen3/prompt_cache.h"
#include "models/qwen3/text_encoder.h"
#include "models/vae/vae.h"
#include "pipeline/dump.h"
#include "pipeline/noise.h"
#include "pipeline/preview.h"
#include "pipeline/stages.h"

namespace klein {

namespace fs = std::filesystem;

namespace {

// Output size when neither a size nor a reference is given (the pipeline's
// default_sample_size 128 × VAE scale 8).
constexpr int64_t kDefaultSide = 1024;
constexpr double kDefaultStrength = 0.8;  // Flux2KleinImg2ImgPipeline's default
constexpr int64_t kPixelsPerToken = 16;

// The initial packed noise [N, 128]: the file's (read in start) if given, else drawn from
// the seed.
Tensor initial_noise(const Generation& g, uint64_t seed, int64_t channels) {
  if (g.noise_from_file.numel() > 0) return flux2::pack_latents(g.noise_from_file);
  Tensor chw({channels, g.grid.rows, g.grid.cols});
  fill_gaussian(chw, seed);
  return flux2::pack_latents(chw);
}

// FLUX.2's denoising phases, for the memory plan. Two phases: the set-up holds the shared unit
// (embedders and modulation; 0.7 GB of bf16 in klein-9B) while the embeddings and every step's
// modulation are computed, with the first block read ahead; it is released before the blocks'
// activations are allocated. Then the steps run the blocks, two at a time (one at a time without
// read-ahead).
std::pair<PhaseNeed, PhaseNeed> denoise_need(const WeightStore& store, const MemoryPlanInputs& in) {
  const TransformerConfig& c = store.config().transformer;
  PhaseNeed setup{"denoise set-up"}, p{"denoise"};
  UnitSizes blocks;
  for (int64_t i = 0; i < c.num_double_blocks; ++i)
    blocks.add(store.unit_bytes(double_block_unit(i)));
  for (int64_t i = 0; i < c.num_single_blocks; ++i)
    blocks.add(store.unit_bytes(single_block_unit(i)));
  const uint64_t shared = store.unit_bytes("transformer.shared");
  const uint64_t first =
      store.unit_bytes(c.num_double_blocks > 0 ? double_block_unit(0) : single_block_unit(0));
  setup.weights_paged = setup.weights_resident = shared + first;
  setup.weights_one_unit = shared;
  p.weights_paged = blocks.two_largest();
  p.weights_resident = blocks.total + shared;  // resident, the shared unit stays
  p.weights_one_unit = blocks.largest;

  flux2::TokenLayout layout;
  layout.text_tokens = in.text_tokens;
  layout.target = {in.height / 16, in.width / 16};
  for (const auto& [w, h] : in.references) layout.references.push_back({h / 16, w / 16});
  const int64_t D = c.inner_dim(), S = layout.total_tokens(), N = layout.target_tokens();
  const int64_t contexts = in.guided ? 2 : 1;
  // The K/V pipeline: a pass over the references alone fills the cache, then the steps run on
  // text and target with the cached rows appended to their keys and values.
  const int64_t B = std::max<int64_t>(in.batch, 1);
  uint64_t block_activations =
      flux2::Activations::plan_bytes(c, layout, flux2::Activations::kDefaultChunkRows, 0, B);
  if (store.config().reference_cache && !layout.references.empty()) {
    flux2::TokenLayout references_only;
    references_only.text_tokens = 0;
    references_only.references = layout.references;
    flux2::TokenLayout steps = layout;
    steps.references.clear();
    const int64_t R = layout.reference_tokens();
    block_activations =
        std::max(
            flux2::Activations::plan_bytes(c, references_only),
            flux2::Activations::plan_bytes(c, steps, flux2::Activations::kDefaultChunkRows, R, B)) +
        flux2::ReferenceKV::plan_bytes(size_t(c.num_double_blocks + c.num_single_blocks), R, D);
  }
  setup.activations =
      f32_bytes(B * contexts * layout.text_tokens * (c.context_dim + D)) +  // contexts, embedded
      f32_bytes(layout.reference_tokens() * (D + c.in_channels)) +          // references
      f32_bytes(B * 5 * N * c.in_channels) +                                // noise, x, velocities
      f32_bytes(std::max<int64_t>(in.steps, 1) * (19 * D + c.timestep_channels)) +  // modulation
      f32_bytes(2 * S * c.head_dim);                                                // RoPE tables
  p.activations = setup.activations + block_activations;
  return {setup, p};
}

// What FLUX.2's stages keep in a generation between stages: the joint sequence's token list
// (text, target, references), which prepare_latents lays out and denoise follows.
struct Flux2State final : Generation::FamilyState {
  flux2::TokenLayout layout;
};

flux2::TokenLayout& token_layout(Generation& g) {
  return static_cast<Flux2State&>(*g.family).layout;
}

// The init image of image-to-image and inpainting as start() reads it: scaled down to a
// megapixel when larger, and the output size it implies (floored to multiples of 16).
struct InitImage {
  Image image;
  std::optional<ImageSize> size;
};

class Flux2Stages final : public FamilyStages {
 public:
  explicit constexpr Flux2Stages(const Flux2Pipeline& pipeline) : p_(pipeline) {}
  // The guidance a request without one gets: the distilled klein runs none (1), klein-base's
  // CFG scale and dev's embedded guidance are 4.
  float default_guidance(const ModelConfig& config) const {
    return config.is_distilled && !p_.embedded_guidance ? 1.0f : 4.0f;
  }
  MemoryPlanInputs memory_inputs(const ModelConfig& config) const override {
    MemoryPlanInputs in;
    in.text_tokens = p_.max_tokens;
    in.context_width = config.transformer.context_dim;
    in.denoise = denoise_need;
    return in;
  }
  Capabilities capabilities(const ModelConfig& config) const override {
    Capabilities c;
    c.references = c.loras = true;
    c.image_to_image = p_.image_to_image;
    // klein-base's CFG scale, or dev's embedded guidance; the distilled klein runs neither.
    c.guidance = p_.embedded_guidance || !config.is_distilled;
    c.negative_prompt = !p_.embedded_guidance && !config.is_distilled;
    c.default_steps = flux2::default_steps(config);
    c.default_guidance = default_guidance(config);
    return c;
  }
  void start(Session& session, Generation& g, Progress& progress) const override;
  void encode_prompt(Session& session, Generation& g, Progress& progress,
                     const TextLayerHook& on_layer) const override;
  std::string prompt_chat_text(std::string_view prompt) const override {
    return p_.chat_text(prompt);
  }
  UpsampleChat upsample_chat(const Tokenizer& tokenizer, std::string_view system,
                             std::string_view prompt) const override {
    return p_.upsample_chat ? p_.upsample_chat(tokenizer, system, prompt)
                            : FamilyStages::upsample_chat(tokenizer, system, prompt);
  }
  UpsampleStyle upsample_style() const override {
    return p_.upsample_style ? p_.upsample_style() : UpsampleStyle{};
  }
  PromptTokens prompt_tokens(const Tokenizer& tokenizer, std::string_view prompt) const override {
    return p_.tokenize(tokenizer, prompt, p_.max_tokens);
  }
  // The 512 padded ids with their mask: the padding rows are part of the context.
  EncodedText encode_text(qwen3::TextEncoder& encoder, const Tokenizer& tokenizer,
                          std::string_view prompt, qwen3::PromptCache* cache,
                          const TextLayerHook& observe) const override {
    EncodedText out;
    out.tokens = prompt_tokens(tokenizer, prompt);
    if (observe) {
      out.context = encoder.encode(out.tokens.ids, out.tokens.mask, observe);
      return out;
    }
    qwen3::CachedContext c =
        qwen3::encode_with_cache(encoder, cache, out.tokens.ids, out.tokens.mask);
    out.context = std::move(c.context);
    out.from_cache = c.from_cache;
    out.store_error = std::move(c.store_error);
    return out;
  }
  void prepare_latents(Session& session, Generation& g, Progress& progress) const override;
  void denoise(Session& session, Generation& g, Progress& progress,
               const StepHook& on_step) const override;
  void denoise_batch(Session& session, std::span<Generation* const> batch, Progress& progress,
                     const StepHook& on_first) const override;
  void decode(Session& session, Generation& g, Progress& progress) const override;

  std::vector<TransformerBlock> transformer_blocks(const ModelConfig& config) const override {
    std::vector<TransformerBlock> blocks;
    const TransformerConfig& c = config.transformer;
    for (int64_t i = 0; i < c.num_double_blocks; ++i)
      blocks.push_back({"transformer_blocks." + std::to_string(i), double_block_unit(i)});
    for (int64_t i = 0; i < c.num_single_blocks; ++i)
      blocks.push_back({"single_transformer_blocks." + std::to_string(i), single_block_unit(i)});
    return blocks;
  }
  int64_t transformer_width(const ModelConfig& config) const override {
    return config.transformer.inner_dim();
  }
  SyntheticProbe synthetic_probe(const ModelConfig& config, LatentGrid grid) const override {
    const TransformerConfig& c = config.transformer;
    SyntheticProbe p;
    p.grid = grid;
    p.latents = Tensor({grid.tokens(), c.in_channels});
    p.context = Tensor({flux2::TokenLayout{}.text_tokens, c.context_dim});
    fill_gaussian(p.latents, 1);
    fill_gaussian(p.context, 2);
    return p;
  }
  ops::ForwardWork forward_work(const ModelConfig& config, LatentGrid grid) const override {
    flux2::TokenLayout layout;
    layout.target = grid;
    return flux2::forward_work(config.transformer, layout);
  }
  std::unique_ptr<Probe> start_probe(WeightStore& store, const ProbeInputs& in,
                                     Compute& cx) const override;
  Tensor decode_latents(WeightStore& store, const Tensor& latents, LatentGrid grid,
                        Compute& cx) const override {
    vae::Vae vae(store, cx);
    return vae.decode(latents, grid.rows, grid.cols);
  }
  Tensor tiny_decoder_input(WeightStore& store, const Tensor& latents, LatentGrid grid,
                            Compute& cx) const override {
    return vae::Vae(store, cx).tokens_to_latent(latents, grid.rows, grid.cols);
  }
  Tensor encode_image(WeightStore& store, const Tensor& pixels, Compute& cx) const override {
    vae::Vae vae(store, cx);
    const int64_t side = vae.pixels_per_token();
    return vae::unpack_tokens(vae.encode(pixels), pixels.dim(1) / side, pixels.dim(2) / side);
  }

 private:
  // One generation's sampler inputs; its steps go to `phase` when `report_steps` is set.
  flux2::SamplerInputs sampler_inputs(Session& session, Generation& g, Progress& progress,
                                      Phase& phase, bool report_steps, const Dumper& dump,
                                      const StepHook& on_step) const;
  // What denoise leaves: the latents and times in g, the inputs it no longer needs released.
  static void finish_denoise(Generation& g, flux2::SamplerResult& out, const Dumper& dump);

  // The steps of start(), in order.
  //
  // Options this pipeline has no counterpart for, refused by name.
  void refuse_what_the_pipeline_lacks(const GenerateOptions& o) const;
  // The LoRAs, the references and the init image, read and checked.
  static InitImage load_inputs(Session& session, Generation& g, Progress& progress);
  // The output size and the token grid; the init image (and mask) at that size.
  static void settle_size(Session& session, Generation& g, Progress& progress, InitImage& init);
  // The steps, and the first one that runs for image-to-image and inpainting.
  static void settle_steps(Generation& g, const ModelConfig& config);
  // Guidance, seed or noise file, arithmetic; what has no effect is said.
  void settle_guidance_and_noise(Session& session, Generation& g, Progress& progress) const;
  // The memory plan against the budget, and the VAE's scratch files checked.
  void plan_memory_and_scratch(Session& session, Generation& g, Progress& progress,
                               const InitImage& init) const;

  const Flux2Pipeline& p_;
};

// The block a transformer observation is the output of, and where it lies in that block's
// output [S, D] (S = text | image tokens): double blocks report their text and image rows
// apart, single blocks the whole stream. Nothing for what is not a block's output.
struct BlockPart {
  size_t block = 0;
  int64_t first_row = 0;
};

std::optional<BlockPart> block_part(std::string_view name, int64_t text_tokens,
                                    int64_t double_blocks) {
  auto index = [](std::string_view digits) {
    int64_t i = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return int64_t(-1);
      i = i * 10 + (c - '0');
    }
    return digits.empty() ? int64_t(-1) : i;
  };
  constexpr std::string_view kDouble = "transformer_blocks.",
                             kSingle = "single_transformer_blocks.";
  if (name.starts_with(kDouble) && (name.ends_with(".txt") || name.ends_with(".img"))) {
    const int64_t i = index(name.substr(kDouble.size(), name.size() - kDouble.size() - 4));
    if (i < 0) return std::nullopt;
    return BlockPart{size_t(i), name.ends_with(".txt") ? 0 : text_tokens};
  }
  if (name.starts_with(kSingle)) {
    const int64_t i = index(name.substr(kSingle.size()));
    if (i < 0) return std::nullopt;
    return BlockPart{size_t(double_blocks + i), 0};
  }
  return std::nullopt;
}

}  // namespace

// One conditional forward as the sampler runs it at a step (no references, no CFG; FLUX.2-dev's
// embedded guidance as the generation gave it).
// The sampler's preparation for one image (flux2::sample_batch): the context embedded, the
// step's modulation and the input and output projections kept, all under one reference to
// "transformer.shared" while the first block is read ahead.
class Flux2Probe final : public FamilyStages::Probe {
 public:
  Flux2Probe(WeightStore& store, const ProbeInputs& in, Compute& cx)
      : in_(in),
        cx_(cx),
        model_(store),
        layout_(layout_of(in)),
        rope_(flux2::joint_position_ids(layout_), model_.config().rope_axes,
              model_.config().rope_theta),
        act_(model_.config(), layout_),
        mod_(model_.config()) {
    const TransformerConfig& c = model_.config();
    const UnitRef shared = store.acquire("transformer.shared");
    store.prefetch(c.num_double_blocks > 0 ? double_block_unit(0) : single_block_unit(0));
    text_ = model_.embed_text(*in.context, cx);
    model_.modulate(in.timestep, mod_, cx,
                    c.guidance_embeds ? std::optional<float>(in.guidance) : std::nullopt);
    model_.keep_io_weights();
  }

  Tensor forward(const BlockObserver& observe) override {
    const TransformerConfig& c = model_.config();
    flux2::Observer blocks;
    if (observe)
      blocks = [&](std::string_view name, const float* data, const Shape& shape) {
        const auto part = block_part(name, layout_.text_tokens, c.num_double_blocks);
        if (part) observe(part->block, part->first_row * c.inner_dim(), data, numel(shape));
      };
    Tensor velocity({in_.grid.tokens(), c.out_channels});
    model_.forward(in_.latents->data(), text_, nullptr, mod_, rope_, act_, velocity.data(), cx_,
                   blocks);
    return velocity;
  }

 private:
  static flux2::TokenLayout layout_of(const ProbeInputs& in) {
    flux2::TokenLayout layout;
    layout.text_tokens = in.context->dim(0);
    layout.target = in.grid;
    return layout;
  }

  const ProbeInputs& in_;
  Compute& cx_;
  flux2::Transformer model_;
  flux2::TokenLayout layout_;
  flux2::RopeTable rope_;
  flux2::Activations act_;
  flux2::Modulation mod_;
  Tensor text_;
};

std::unique_ptr<FamilyStages::Probe> Flux2Stages::start_probe(WeightStore& store,
                                                              const ProbeInputs& in,
                                                              Compute& cx) const {
  return std::make_unique<Flux2Probe>(store, in, cx);
}

// Sizes, steps, guidance, seed and precision as the official pipeline picks them, the
// references loaded and checked, and the memory plan: all before any network runs.
void Flux2Stages::start(Session& session, Generation& g, Progress& progress) const {
  g.family = std::make_shared<Flux2State>();
  refuse_what_the_pipeline_lacks(g.options);
  InitImage init = load_inputs(session, g, progress);
  settle_size(session, g, progress, init);
  settle_steps(g, session.weights().config());
  settle_guidance_and_noise(session, g, progress);
  plan_memory_and_scratch(session, g, progress, init);
}

void Flux2Stages::refuse_what_the_pipeline_lacks(const GenerateOptions& o) const {
  check(!o.step_cache, "--cache: step caching runs with Z-Image so far; ", p_.name,
        " runs every step in full");
  check(!o.cfg_normalization && !o.cfg_truncation,
        "--cfg-normalization and --cfg-truncation "
        "are Z-Image's guidance options; ",
        p_.name, "'s guidance has neither");
  check(o.control_image.empty() && o.controlnet.empty() && !o.control_scale && !o.control_canny,
        p_.name,
        " has no control model: --controlnet, --control-image and --control-scale are Z-Image's");
  check(o.vae_noise_file.empty(), "--vae-noise: ", p_.name,
        "'s pipelines encode the init image's mean, which draws no noise");
  check(p_.image_to_image || (o.init_image.empty() && o.mask.empty() && !o.strength), p_.name,
        "'s pipeline has no image-to-image or inpainting: give the picture as a --reference "
        "(an edit) instead of --init-image");
}

InitImage Flux2Stages::load_inputs(Session& session, Generation& g, Progress& progress) {
  const GenerateOptions& o = g.options;
  const ModelConfig& config = session.weights().config();
  GenerateResult& r = g.result;
  // LoRAs: every file read and checked against this transformer before any other work.
  if (!o.loras.empty())
    session.timed(g, progress, "load LoRA", 0, [&](Phase&) {
      g.adapters = std::make_shared<const Adapters>(Adapters::load(o.loras, config));
    });
  if (!o.references.empty())
    session.timed(g, progress, "load references", 0, [&](Phase&) {
      for (const auto& path : o.references) g.reference_pixels.push_back(load_reference(path));
    });
  // Image-to-image: the init image, scaled down to a megapixel when larger; its size floored
  // to multiples of 16 is the output's unless the caller gives one.
  check(!o.strength || !o.init_image.empty(),
        "--strength needs --init-image (the picture whose content it keeps)");
  InitImage init;
  check(o.mask.empty() || !o.init_image.empty(),
        "--mask needs --init-image (the picture the mask applies to)");
  g.inpaint = !o.mask.empty();
  if (!o.init_image.empty()) {
    check(g.inpaint || o.references.empty(),
          "--init-image and --reference exclude each other "
          "without --mask: image-to-image passes no reference images to the transformer");
    const double s = o.strength.value_or(kDefaultStrength);
    check(std::isfinite(s) && s > 0 && s <= 1, "strength: expected a number in (0, 1], got ", s);
    r.strength = s;
    session.timed(g, progress, "load init image", 0, [&](Phase&) {
      init.image = load_image(o.init_image);
      // The image-to-image pipeline checks the init image like a reference; inpainting not.
      if (!g.inpaint)
        check_reference_size(o.init_image.string(), init.image.width, init.image.height);
      const ImageSize t = reference_resize_target(init.image.width, init.image.height);
      if (t.width != init.image.width || t.height != init.image.height)
        init.image = resize_lanczos(init.image, t.width, t.height);
    });
    init.size = init_image_size(init.image);
    check(init.size->width >= kPixelsPerToken && init.size->height >= kPixelsPerToken,
          o.init_image.string(), ": ", init.image.width, "x", init.image.height,
          " is too small for an init image (at least 16x16 pixels)");
  }
  return init;
}

void Flux2Stages::settle_size(Session& session, Generation& g, Progress& progress,
                              InitImage& init) {
  const GenerateOptions& o = g.options;
  GenerateResult& r = g.result;
  const std::optional<ImageSize>& init_size = init.size;
  if (g.inpaint)  // the inpainting pipeline always takes the init image's size
    check((o.width <= 0 || o.width == init_size->width) &&
              (o.height <= 0 || o.height == init_size->height),
          "inpainting keeps the init image's size, ", init_size->width, "x", init_size->height,
          "; -W/-H ask for ", o.width, "x", o.height);
  int64_t width = o.width, height = o.height;
  const Tensor* first = g.reference_pixels.empty() ? nullptr : &g.reference_pixels[0];
  if (width <= 0) width = init_size ? init_size->width : first ? first->dim(2) : kDefaultSide;
  if (height <= 0) height = init_size ? init_size->height : first ? first->dim(1) : kDefaultSide;
  settle_output_size(session, g, progress, width, height, kPixelsPerToken);
  width = r.width;
  height = r.height;
  g.grid = {height / kPixelsPerToken, width / kPixelsPerToken};
  if (init_size && g.inpaint) {
    // Scaled to the size (the processor's "default" mode; unchanged when it already fits).
    if (init.image.width != width || init.image.height != height)
      init.image = resize_lanczos(init.image, int(width), int(height));
    g.init_pixels = image_to_tensor(init.image);
    Image mask_image;
    session.timed(g, progress, "load mask", 0, [&](Phase&) { mask_image = load_image(o.mask); });
    g.mask_latents = resample_bilinear(binary_mask(mask_image, int(width), int(height)),
                                       int(height), int(width), int(g.grid.rows), int(g.grid.cols));
  } else if (init_size) {
    g.init_pixels = image_to_tensor(crop_centered(init.image, int(width), int(height)));
  }
}

void Flux2Stages::settle_steps(Generation& g, const ModelConfig& config) {
  const GenerateOptions& o = g.options;
  GenerateResult& r = g.result;
  check(o.steps >= 0 && o.steps <= kMaxSteps, "steps: expected 1 to ", kMaxSteps, ", got ",
        o.steps);
  r.steps = o.steps > 0 ? o.steps : flux2::default_steps(config);
  if (r.strength) {
    // How many of the last steps run, as each official pipeline counts them (in double
    // precision, like Python): image-to-image int(steps · s); inpainting
    // steps - int(steps - min(steps · s, steps)), which rounds the other way.
    const double scaled = double(r.steps) * *r.strength;
    const int64_t run =
        g.inpaint
            ? r.steps - int64_t(std::max(double(r.steps) - std::min(scaled, double(r.steps)), 0.0))
            : std::min(int64_t(scaled), r.steps);
    check(run >= 1, "strength ", *r.strength, " with ", r.steps,
          " steps runs no step (int(steps x strength) = 0): raise --strength or --steps");
    g.first_step = r.steps - run;
  }
}

void Flux2Stages::settle_guidance_and_noise(Session& session, Generation& g,
                                            Progress& progress) const {
  const GenerateOptions& o = g.options;
  const ModelConfig& config = session.weights().config();
  GenerateResult& r = g.result;
  r.guidance = o.guidance.value_or(default_guidance(config));
  check(std::isfinite(r.guidance), "guidance: expected a finite number, got ", r.guidance);
  // The noise file replaces the seed: a seed would describe noise that was not used.
  check(o.noise_file.empty() || !o.seed,
        "--noise and --seed exclude each other: the noise file "
        "is the initial noise");
  if (o.noise_file.empty())
    r.seed = o.seed ? *o.seed : random_seed();
  else
    g.noise_from_file = read_noise_file(
        o.noise_file, {1, config.transformer.in_channels, g.grid.rows, g.grid.cols});
  g.guided = flux2::uses_guidance(config, r.guidance);
  r.guided = g.guided;
  r.embedded_guidance = p_.embedded_guidance;
  if (p_.embedded_guidance && !o.negative_prompt.empty())
    session.warn(
        g, progress,
        std::string(p_.name) +
            " runs one pass per step (its guidance is "
            "embedded in the model): the negative prompt has no effect and is not recorded");
  else if (!p_.embedded_guidance && config.is_distilled &&
           ((o.guidance && *o.guidance != 1.0f) || !o.negative_prompt.empty()))
    session.warn(g, progress,
                 "this model is distilled (no classifier-free guidance): the guidance and "
                 "the negative prompt have no effect and are not recorded in the image");
  r.fast = runs_fast(o.precision, session.weights());
}

void Flux2Stages::plan_memory_and_scratch(Session& session, Generation& g, Progress& progress,
                                          const InitImage& init) const {
  const GenerateOptions& o = g.options;
  const ModelConfig& config = session.weights().config();
  GenerateResult& r = g.result;
  const int64_t width = r.width, height = r.height;
  const std::optional<ImageSize>& init_size = init.size;
  // Memory: how much this generation needs, resident or paged, against the budget.
  if (o.plan_memory) {
    MemoryPlanInputs need = memory_inputs(session.weights().config());
    need.width = width;
    need.height = height;
    for (const auto& ref : g.reference_pixels) need.references.emplace_back(ref.dim(2), ref.dim(1));
    if (init_size) need.references.emplace_back(width, height);  // encoded like a reference
    need.steps = r.steps;
    need.guided = g.guided;
    need.batch = o.batch;
    need.adapter_bytes = g.adapters ? g.adapters->bytes() : 0;
    need.vae_memory = o.vae_memory;
    r.memory = plan_memory(estimate_memory(session.weights(), need), o.max_memory,
                           available_memory_bytes(), o.residency);
    session.weights().set_residency(r.memory->residency);
    session.weights().set_read_ahead(r.memory->read_ahead);
    progress.memory_plan(*r.memory);
  }
  // A banded encode's or decode's scratch files: a bad TMPDIR is found now, not after the
  // denoising.
  if (!o.plan_only) {
    std::vector<std::pair<int64_t, int64_t>> encodes;  // (height, width)
    for (const auto& ref : g.reference_pixels) encodes.emplace_back(ref.dim(1), ref.dim(2));
    if (init_size) encodes.emplace_back(height, width);
    vae::check_scratch(config.vae, encodes, height, width, o.vae_memory);
  }
}

// Text: prompt (and the negative prompt for CFG) → contexts. The encoder's weights are
// acquired layer by layer and released before denoising starts. The text encoder always
// runs in float32: its 27 layers amplify rounding (8e-2 of the context on the tiny model in
// bf16, against 1e-5).
void Flux2Stages::encode_prompt(Session& session, Generation& g, Progress& progress,
                                const TextLayerHook& on_layer) const {
  const GenerateOptions& o = g.options;
  session.timed(g, progress, "text encoder", 0, [&](Phase& phase) {
    const Compute::Use exact(session.compute(), Arithmetic::exact());
    // A step per layer; with a negative prompt the layers run twice.
    const int passes = g.guided ? 2 : 1;
    int pass = 0;
    const Compute::Reporting layers(session.compute(), [&](int64_t done, int64_t total) {
      phase.step(int(pass * total + done), int(passes * total));
    });
    qwen3::TextEncoder encoder(session.weights(), session.compute());
    std::optional<qwen3::PromptCache> cache;
    if (o.prompt_cache_dir) cache.emplace(*o.prompt_cache_dir);
    auto encode = [&](const std::string& text, bool& from_cache, const TextLayerHook& observe) {
      return encode_for(session, g, progress, encoder, cache ? &*cache : nullptr, text, from_cache,
                        observe);
    };
    g.context = encode(o.prompt, g.result.context_from_cache, on_layer);
    bool unused;
    pass = 1;
    if (g.guided) g.negative = encode(o.negative_prompt, unused, {});
  });
  session.weights().release("text_encoder.");
  const Dumper dump(o.dump_dir);
  dump.f32("prompt_embeds", g.context, {1, g.context.dim(0), g.context.dim(1)});
  if (g.guided)
    dump.f32("negative_prompt_embeds", g.negative, {1, g.negative.dim(0), g.negative.dim(1)});
}

// The initial latents (seeded noise or --noise) and the references' clean latent tokens,
// fixed for the whole loop.
void Flux2Stages::prepare_latents(Session& session, Generation& g, Progress& progress) const {
  const GenerateOptions& o = g.options;
  const Dumper dump(o.dump_dir);
  g.noise = initial_noise(g, g.result.seed.value_or(0),
                          session.weights().config().transformer.in_channels);
  dump.f32("noise", flux2::unpack_latents(g.noise, g.grid),
           {1, g.noise.dim(1), g.grid.rows, g.grid.cols});
  if (g.init_pixels.numel() > 0) {
    // Image-to-image: the init image's latents, noised to the σ where the kept steps start.
    Tensor image;
    session.timed(g, progress, "vae encode", 0, [&](Phase& phase) {
      const Compute::Use arithmetic(session.compute(), arithmetic_for(g.result.fast));
      const Compute::Reporting blocks(session.compute(), [&](int64_t done, int64_t total) {
        phase.step(int(done), int(total));
      });
      vae::Vae vae(session.weights(), session.compute(), g.options.vae_memory);
      image = vae.encode(g.init_pixels);
    });
    session.weights().release("vae.encoder");
    g.init_pixels = Tensor();
    check(image.shape() == g.noise.shape(), "internal: init image latents ",
          shape_str(image.shape()), " against noise ", shape_str(g.noise.shape()));
    if (g.inpaint)  // the two pipelines record these latents in different layouts
      dump.f32("image_latents", image, {1, image.dim(0), image.dim(1)});
    else
      dump.f32("image_latents", flux2::unpack_latents(image, g.grid),
               {1, image.dim(1), g.grid.rows, g.grid.cols});
    if (g.inpaint) {
      g.init_noise = Tensor(g.noise.shape());
      std::memcpy(g.init_noise.data(), g.noise.data(), size_t(g.noise.numel()) * sizeof(float));
      dump.f32("mask_latents", g.mask_latents.data(), {1, int64_t(g.mask_latents.size()), 1});
    }
    const flux2::Schedule schedule =
        flux2::make_schedule(session.weights().config().scheduler, g.grid.tokens(), g.result.steps);
    const float sigma = schedule.sigmas[size_t(g.first_step)];
    float* x = g.noise.data();
    const float* x0 = image.data();
    for (int64_t i = 0; i < g.noise.numel(); ++i) x[i] = sigma * x[i] + (1.0f - sigma) * x0[i];
    dump.f32("initial_latents", g.noise, {1, g.noise.dim(0), g.noise.dim(1)});
    if (g.inpaint) g.init_latents = std::move(image);
  }

  token_layout(g) = flux2::TokenLayout{};
  token_layout(g).text_tokens = g.context.dim(0);
  token_layout(g).target = g.grid;
  if (g.inpaint) {  // the init image is the first condition, before any reference
    Tensor condition(g.init_latents.shape());
    std::memcpy(condition.data(), g.init_latents.data(), size_t(condition.numel()) * sizeof(float));
    g.reference_tokens.push_back(std::move(condition));
    token_layout(g).references.push_back(g.grid);
  }
  if (!g.reference_pixels.empty()) {
    const int n = int(g.reference_pixels.size());
    session.timed(g, progress, "vae encode", 0, [&](Phase& phase) {
      const Compute::Use arithmetic(session.compute(), arithmetic_for(g.result.fast));
      vae::Vae vae(session.weights(), session.compute(), g.options.vae_memory);
      // A step per encoder block of every reference.
      int i = 0;
      const Compute::Reporting blocks(session.compute(), [&](int64_t done, int64_t total) {
        phase.step(int(i * total + done), int(n * total));
      });
      for (; i < n; ++i) {
        const Tensor& pixels = g.reference_pixels[size_t(i)];
        g.reference_tokens.push_back(vae.encode(pixels));
        token_layout(g).references.push_back(
            {pixels.dim(1) / kPixelsPerToken, pixels.dim(2) / kPixelsPerToken});
      }
    });
    session.weights().release("vae.encoder");
    g.reference_pixels.clear();
  }
  if (dump.on()) {
    dump.ids("txt_ids", flux2::text_position_ids(token_layout(g).text_tokens));
    if (session.weights().config().reference_cache && !token_layout(g).references.empty()) {
      // The K/V pipeline: references first at step 0 (as its reference pass sees them), the
      // target alone at every step.
      flux2::TokenLayout target = token_layout(g), references = token_layout(g);
      target.references.clear();
      references.target = {};
      std::vector<flux2::PositionId> step0 = flux2::image_position_ids(references);
      const std::vector<flux2::PositionId> image = flux2::image_position_ids(target);
      step0.insert(step0.end(), image.begin(), image.end());
      dump.ids("step0_img_ids", step0);
      dump.ids("img_ids", image);
    } else {
      dump.ids("img_ids", flux2::image_position_ids(token_layout(g)));
    }
    if (!g.reference_tokens.empty()) {
      Tensor all({token_layout(g).reference_tokens(), g.noise.dim(1)});
      float* p = all.data();
      for (const auto& t : g.reference_tokens) {
        std::memcpy(p, t.data(), size_t(t.numel()) * sizeof(float));
        p += t.numel();
      }
      dump.f32(g.inpaint ? "condition_tokens" : "ref_tokens", all, {1, all.dim(0), all.dim(1)});
    }
  }
}

flux2::SamplerInputs Flux2Stages::sampler_inputs(Session& session, Generation& g,
                                                 Progress& progress, Phase& phase,
                                                 bool report_steps, const Dumper& dump,
                                                 const StepHook& on_step) const {
  GenerateResult& r = g.result;
  flux2::SamplerInputs in;
  in.context = &g.context;
  in.negative_context = g.guided ? &g.negative : nullptr;
  in.noise = &g.noise;
  in.target = g.grid;
  for (size_t i = 0; i < g.reference_tokens.size(); ++i)
    in.references.push_back({&g.reference_tokens[i], token_layout(g).references[i]});
  in.schedule =
      flux2::make_schedule(session.weights().config().scheduler, g.grid.tokens(), r.steps);
  if (g.inpaint) {
    // Inpainting: the schedule from where the kept steps start; after each Euler update
    // the unmasked part goes back to the init image, noised to the next step's σ (clean
    // after the last step).
    auto& timesteps = in.schedule.timesteps;
    auto& sigmas = in.schedule.sigmas;
    timesteps.erase(timesteps.begin(), timesteps.begin() + g.first_step);
    sigmas.erase(sigmas.begin(), sigmas.begin() + g.first_step);
    const int64_t run = int64_t(timesteps.size());
    in.after_update = [&g, sigmas, run](int64_t step, Tensor& latents) {  // owns its σs
      const int64_t channels = latents.dim(1);
      const bool last = step == run - 1;
      const float sigma = last ? 0.0f : sigmas[size_t(step + 1)];
      const float* x0 = g.init_latents.data();
      const float* noise = g.init_noise.data();
      float* x = latents.data();
      for (int64_t t = 0; t < latents.dim(0); ++t) {
        const float m = g.mask_latents[size_t(t)];
        for (int64_t c = 0; c < channels; ++c) {
          const int64_t i = t * channels + c;
          const float proper = last ? x0[i] : sigma * noise[i] + (1.0f - sigma) * x0[i];
          x[i] = (1.0f - m) * proper + m * x[i];
        }
      }
    };
  } else if (g.first_step > 0) {
    // Image-to-image: the transformer sees the last timesteps, but the official pipeline
    // resets the scheduler's step index to 0 before its loop, so each Euler update takes
    // σ from the start of the schedule (steps 0..run), not from where the timesteps are.
    // Followed as it is: that is the image Flux2KleinImg2ImgPipeline makes.
    auto& timesteps = in.schedule.timesteps;
    timesteps.erase(timesteps.begin(), timesteps.begin() + g.first_step);
    in.schedule.sigmas.resize(timesteps.size() + 1);
  }
  for (const auto& w : in.schedule.warnings) session.warn(g, progress, w);
  in.guidance = r.guidance;
  in.adapters = g.adapters.get();
  // Outlives this call (the caller's phase, dump and generation; a copy of the hook).
  in.on_step = [&dump, &phase, &g, on_step, report_steps](const flux2::StepInfo& s) {
    if (dump.on()) {
      const std::string p = "step" + std::to_string(s.step) + "_";
      const Shape tokens = {1, s.latents_in.dim(0), s.latents_in.dim(1)};
      dump.f32(p + "timestep", &s.timestep, {1});
      dump.f32(p + "latents_in", s.latents_in, tokens);
      dump.f32(p + "velocity", s.velocity, tokens);
      dump.f32(p + "latents_out", s.latents_out, tokens);
    }
    if (report_steps) phase.step(int(s.step + 1), int(s.steps));
    if (on_step)
      on_step(StepView{s.step, s.steps, s.latents_out, s.latents_in, s.timestep, g.grid, s.velocity,
                       s.sigma,
                       [&] { return step_preview(s.latents_in, s.velocity, s.sigma, g.grid); }});
  };
  return in;
}

void Flux2Stages::finish_denoise(Generation& g, flux2::SamplerResult& out, const Dumper& dump) {
  g.latents = std::move(out.latents);
  g.result.denoise_setup_seconds = out.setup_seconds;
  g.result.step_seconds = out.step_seconds;
  dump.f32("final_latents", g.latents, {1, g.latents.dim(0), g.latents.dim(1)});
  g.context = Tensor();
  g.negative = Tensor();
  g.noise = Tensor();
  g.reference_tokens.clear();
  g.init_latents = Tensor();
  g.init_noise = Tensor();
}

// The sampler loop, with the transformer (attention and float-weight projections) in the
// generation's arithmetic.
void Flux2Stages::denoise(Session& session, Generation& g, Progress& progress,
                          const StepHook& on_step) const {
  GenerateResult& r = g.result;
  const Dumper dump(g.options.dump_dir);
  flux2::SamplerResult out;
  session.timed(g, progress, "denoise", int(r.steps - g.first_step), [&](Phase& phase) {
    const flux2::SamplerInputs in =
        sampler_inputs(session, g, progress, phase, true, dump, on_step);
    const Compute::Use arithmetic(session.compute(), arithmetic_for(r.fast));
    out = flux2::sample(session.weights(), in, session.compute());
    for (const auto& w : out.warnings) session.warn(g, progress, w);
  });
  session.weights().release("transformer.");
  finish_denoise(g, out, dump);
}

// A batch: one sampler loop for all (flux2::sample_batch refuses what they do not share),
// timed once and recorded in every generation's result; the first one's steps are the
// phase's progress and go to `on_first`.
void Flux2Stages::denoise_batch(Session& session, std::span<Generation* const> batch,
                                Progress& progress, const StepHook& on_first) const {
  check(!batch.empty(), "denoise: an empty batch");
  Generation& first = *batch[0];
  for (Generation* g : batch)
    check(g->result.fast == first.result.fast && g->first_step == first.first_step &&
              g->result.steps == first.result.steps,
          "denoise: a batch runs at one precision and one set of steps");
  std::vector<Dumper> dumps;
  for (Generation* g : batch) dumps.emplace_back(g->options.dump_dir);
  std::vector<flux2::SamplerResult> out;
  session.timed(
      first, progress, "denoise", int(first.result.steps - first.first_step), [&](Phase& phase) {
        std::vector<flux2::SamplerInputs> inputs;
        for (size_t i = 0; i < batch.size(); ++i)
          inputs.push_back(sampler_inputs(session, *batch[i], progress, phase, i == 0, dumps[i],
                                          i == 0 ? on_first : StepHook()));
        const Compute::Use arithmetic(session.compute(), arithmetic_for(first.result.fast));
        out = flux2::sample_batch(session.weights(), inputs, session.compute());
        for (size_t i = 0; i < batch.size(); ++i)
          for (const auto& w : out[i].warnings) session.warn(*batch[i], progress, w);
      });
  session.weights().release("transformer.");
  for (size_t i = 0; i < batch.size(); ++i) {
    Generation& g = *batch[i];
    if (i > 0) {  // the phase's time and memory, as the first generation recorded them
      g.result.timings.push_back(first.result.timings.back());
      g.result.phase_memory.push_back(first.result.phase_memory.back());
    }
    finish_denoise(g, out[i], dumps[i]);
  }
}

// Latents → pixels.
void Flux2Stages::decode(Session& session, Generation& g, Progress& progress) const {
  const Dumper dump(g.options.dump_dir);
  Tensor decoded;
  session.timed(g, progress, "vae decode", 0, [&](Phase& phase) {
    const Compute::Use arithmetic(session.compute(), arithmetic_for(g.result.fast));
    const Compute::Reporting blocks(
        session.compute(), [&](int64_t done, int64_t total) { phase.step(int(done), int(total)); });
    vae::Vae vae(session.weights(), session.compute(), g.options.vae_memory);
    Tensor z = vae.tokens_to_latent(g.latents, g.grid.rows, g.grid.cols);
    dump.f32("vae_input", z, {1, z.dim(0), z.dim(1), z.dim(2)});
    decoded = vae.decode_latent(z);
  });
  finish_decode(session, g, std::move(decoded));
}

std::unique_ptr<FamilyStages> flux2_stages(const Flux2Pipeline& pipeline) {
  return std::make_unique<Flux2Stages>(pipeline);
}

}  // namespace klein
