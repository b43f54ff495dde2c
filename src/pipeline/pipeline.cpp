#include "pipeline/pipeline.h"

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/memory.h"
#include "core/npy.h"
#include "core/version.h"
#include "formats/image/preprocess.h"
#include "formats/image/resize.h"
#include "models/flux2/positions.h"
#include "models/flux2/sampler.h"
#include "models/flux2/schedule.h"
#include "models/qwen3/prompt_cache.h"
#include "models/qwen3/text_encoder.h"
#include "models/vae/vae.h"
#include "pipeline/model_tokenizer.h"
#include "pipeline/noise.h"
#include "tokenizer/klein_prompt.h"

namespace klein {

namespace fs = std::filesystem;

namespace {

// Output size when neither a size nor a reference is given (the pipeline's
// default_sample_size 128 × VAE scale 8).
constexpr int64_t kDefaultSide = 1024;
constexpr double kDefaultStrength = 0.8;  // Flux2KleinImg2ImgPipeline's default
constexpr int64_t kPixelsPerToken = 16;

// Writes pipeline stages as .npy files with the names and layouts of the golden vectors
// (testdata vectors/e2e/<case>/), batch dimension included. Does nothing without a directory.
class Dumper {
 public:
  explicit Dumper(fs::path dir) : dir_(std::move(dir)) {
    if (!dir_.empty()) fs::create_directories(dir_);
  }
  bool on() const { return !dir_.empty(); }
  void f32(const std::string& name, const float* data, const Shape& shape) const {
    if (on()) write_npy(dir_ / (name + ".npy"), DType::F32, shape, data);
  }
  void f32(const std::string& name, const Tensor& t, const Shape& shape) const {
    f32(name, t.data(), shape);
  }
  void ids(const std::string& name, const std::vector<flux2::PositionId>& ids) const {
    if (!on()) return;
    std::vector<int64_t> flat;
    for (const auto& id : ids) flat.insert(flat.end(), id.begin(), id.end());
    write_npy(dir_ / (name + ".npy"), DType::I64, {1, int64_t(ids.size()), 4}, flat.data());
  }

 private:
  fs::path dir_;
};

// The initial packed noise [N, 128]: from the file if given (checked against the size),
// else drawn from the seed.
Tensor initial_noise(const GenerateOptions& o, uint64_t seed, flux2::LatentGrid grid,
                     int64_t channels) {
  const Shape expected = {1, channels, grid.rows, grid.cols};
  Tensor chw({channels, grid.rows, grid.cols});
  if (!o.noise_file.empty()) {
    NpyArray a = read_npy(o.noise_file);
    check(a.dtype == DType::F32 && a.shape == expected, "--noise ", o.noise_file.string(),
          ": expected float32 ", shape_str(expected), " for this size, got ", dtype_name(a.dtype),
          " ", shape_str(a.shape));
    std::memcpy(chw.data(), a.bytes.data(), a.bytes.size());
    for (int64_t i = 0; i < chw.numel(); ++i)
      check(std::isfinite(chw.data()[i]), "--noise ", o.noise_file.string(), ": value ", i,
            " is ", chw.data()[i], "; the initial noise must be finite");
  } else {
    auto values = gaussian_noise(seed, chw.numel());
    std::memcpy(chw.data(), values.data(), values.size() * sizeof(float));
  }
  return flux2::pack_latents(chw);
}

}  // namespace

int64_t floor_to_multiple(int64_t value, int64_t multiple) { return value / multiple * multiple; }

const char* precision_name(bool fast) { return fast ? "fast" : "exact"; }

bool runs_fast(Precision requested, const WeightStore& weights) {
  return requested == Precision::Fast ||
         (requested == Precision::Auto && weights.has_quantized("transformer."));
}

Model Model::open(const ModelPaths& paths) {
  std::unique_ptr<WeightStore> weights = open_model(paths);
  check(weights->config().undecided_variant.empty(), weights->config().undecided_variant);
  const std::string needs_conversion = weights->origin().needs_conversion;
  check(needs_conversion.empty(), needs_conversion);
  Model m{std::move(weights), load_model_tokenizer(paths), "", ""};
  m.name = m.weights->config().name;
  if (fs::is_regular_file(paths.model)) m.checksum = m.weights->identity();
  return m;
}

Session::Session(WeightStore& weights, const Tokenizer& tokenizer, Compute& cx)
    : weights_(weights), tokenizer_(tokenizer), cx_(cx) {}

void Session::warn(Generation& g, Progress& progress, const std::string& message) {
  g.result.warnings.push_back(message);
  progress.warn(message);
}

// Runs one phase: its time, and the peak RSS while it ran, into the result.
template <class Fn>
void Session::timed(Generation& g, Progress& progress, const std::string& name, int total,
                    Fn&& fn) {
  cx_.stop_if_cancelled();
  return_free_memory();  // what the previous phase freed
  const bool exact = reset_peak_rss();
  const uint64_t start_rss = current_rss_bytes();
  {
    Phase phase(progress, name, total);
    fn(phase);
    g.result.timings.emplace_back(name, phase.seconds());
  }
  g.result.phase_memory.push_back(
      {name, start_rss, exact ? peak_rss_since_reset() : peak_rss_bytes(), exact});
}

// Sizes, steps, guidance, seed and precision as the official pipeline picks them, the
// references loaded and checked, and the memory plan: all before any network runs.
Generation Session::start(const GenerateOptions& o, Progress& progress) {
  const ModelConfig& config = weights_.config();
  Generation g;
  g.options = o;
  GenerateResult& r = g.result;
  weights_.reset_peak();
  cx_.clear_cancel();
  for (const auto& file : weights_.origin().files)
    g.model_files.emplace_back(file, FileStamp::of(file));

  // LoRAs: every file read and checked against this transformer before any other work.
  if (!o.loras.empty())
    timed(g, progress, "load LoRA", 0, [&](Phase&) {
      g.adapters = std::make_shared<const Adapters>(Adapters::load(o.loras, config.transformer));
    });
  if (!o.references.empty())
    timed(g, progress, "load references", 0, [&](Phase&) {
      for (const auto& path : o.references) g.reference_pixels.push_back(load_reference(path));
    });
  // Image-to-image: the init image, scaled down to a megapixel when larger; its size floored
  // to multiples of 16 is the output's unless the caller gives one.
  check(!o.strength || !o.init_image.empty(),
        "--strength needs --init-image (the picture whose content it keeps)");
  Image init;
  std::optional<ImageSize> init_size;
  check(o.mask.empty() || !o.init_image.empty(),
        "--mask needs --init-image (the picture the mask applies to)");
  g.inpaint = !o.mask.empty();
  if (!o.init_image.empty()) {
    check(g.inpaint || o.references.empty(), "--init-image and --reference exclude each other "
          "without --mask: image-to-image passes no reference images to the transformer");
    const double s = o.strength.value_or(kDefaultStrength);
    check(std::isfinite(s) && s > 0 && s <= 1, "strength: expected a number in (0, 1], got ", s);
    r.strength = s;
    timed(g, progress, "load init image", 0, [&](Phase&) {
      init = load_image(o.init_image);
      // The image-to-image pipeline checks the init image like a reference; inpainting not.
      if (!g.inpaint) check_reference_size(o.init_image.string(), init.width, init.height);
      const ImageSize t = reference_resize_target(init.width, init.height);
      if (t.width != init.width || t.height != init.height)
        init = resize_lanczos(init, t.width, t.height);
    });
    init_size = init_image_size(init);
    check(init_size->width >= kPixelsPerToken && init_size->height >= kPixelsPerToken,
          o.init_image.string(), ": ", init.width, "x", init.height,
          " is too small for an init image (at least 16x16 pixels)");
  }
  if (g.inpaint)  // the inpainting pipeline always takes the init image's size
    check((o.width <= 0 || o.width == init_size->width) &&
              (o.height <= 0 || o.height == init_size->height),
          "inpainting keeps the init image's size, ", init_size->width, "x", init_size->height,
          "; -W/-H ask for ", o.width, "x", o.height);
  int64_t width = o.width, height = o.height;
  const Tensor* first = g.reference_pixels.empty() ? nullptr : &g.reference_pixels[0];
  if (width <= 0) width = init_size ? init_size->width : first ? first->dim(2) : kDefaultSide;
  if (height <= 0) height = init_size ? init_size->height : first ? first->dim(1) : kDefaultSide;
  check(width >= kPixelsPerToken && height >= kPixelsPerToken, "image size ", width, "x", height,
        " is too small (at least 16x16)");
  check(width <= 8192 && height <= 8192, "image size ", width, "x", height,
        " is too large (at most 8192 on a side)");
  if (width % kPixelsPerToken || height % kPixelsPerToken) {
    const int64_t w16 = floor_to_multiple(width, kPixelsPerToken);
    const int64_t h16 = floor_to_multiple(height, kPixelsPerToken);
    warn(g, progress, "width and height must be multiples of 16: producing " +
                          std::to_string(w16) + "x" + std::to_string(h16) + " instead of " +
                          std::to_string(width) + "x" + std::to_string(height));
    width = w16;
    height = h16;
  }
  r.width = width;
  r.height = height;
  g.grid = {height / kPixelsPerToken, width / kPixelsPerToken};
  if (init_size && g.inpaint) {
    // Scaled to the size (the processor's "default" mode; unchanged when it already fits).
    if (init.width != width || init.height != height)
      init = resize_lanczos(init, int(width), int(height));
    g.init_pixels = image_to_tensor(init);
    Image mask_image;
    timed(g, progress, "load mask", 0, [&](Phase&) { mask_image = load_image(o.mask); });
    g.mask_latents = resample_bilinear(binary_mask(mask_image, int(width), int(height)),
                                       int(height), int(width), int(g.grid.rows),
                                       int(g.grid.cols));
  } else if (init_size) {
    g.init_pixels = image_to_tensor(crop_centered(init, int(width), int(height)));
  }
  check(o.steps >= 0 && o.steps <= kMaxSteps, "steps: expected 1 to ", kMaxSteps, ", got ",
        o.steps);
  r.steps = o.steps > 0 ? o.steps : flux2::default_steps(config);
  if (r.strength) {
    // How many of the last steps run, as each official pipeline counts them (in double
    // precision, like Python): image-to-image int(steps · s); inpainting
    // steps - int(steps - min(steps · s, steps)), which rounds the other way.
    const double scaled = double(r.steps) * *r.strength;
    const int64_t run =
        g.inpaint ? r.steps - int64_t(std::max(double(r.steps) - std::min(scaled, double(r.steps)), 0.0))
                  : std::min(int64_t(scaled), r.steps);
    check(run >= 1, "strength ", *r.strength, " with ", r.steps,
          " steps runs no step (int(steps x strength) = 0): raise --strength or --steps");
    g.first_step = r.steps - run;
  }
  r.guidance = o.guidance.value_or(config.is_distilled ? 1.0f : 4.0f);
  check(std::isfinite(r.guidance), "guidance: expected a finite number, got ", r.guidance);
  // The noise file replaces the seed: a seed would describe noise that was not used.
  check(o.noise_file.empty() || !o.seed, "--noise and --seed exclude each other: the noise file "
        "is the initial noise");
  if (o.noise_file.empty()) r.seed = o.seed ? *o.seed : random_seed();
  g.guided = flux2::uses_guidance(config, r.guidance);
  r.guided = g.guided;
  if (config.is_distilled && ((o.guidance && *o.guidance != 1.0f) || !o.negative_prompt.empty()))
    warn(g, progress, "this model is distilled (no classifier-free guidance): the guidance and "
                      "the negative prompt have no effect and are not recorded in the image");
  r.fast = runs_fast(o.precision, weights_);

  // Memory: how much this generation needs, resident or paged, against the budget.
  if (o.plan_memory) {
    MemoryPlanInputs need;
    need.width = width;
    need.height = height;
    for (const auto& ref : g.reference_pixels) need.references.emplace_back(ref.dim(2), ref.dim(1));
    if (init_size) need.references.emplace_back(width, height);  // encoded like a reference
    need.steps = r.steps;
    need.guided = g.guided;
    need.adapter_bytes = g.adapters ? g.adapters->bytes() : 0;
    need.vae_memory = o.vae_memory;
    r.memory = plan_memory(estimate_memory(weights_, need), o.max_memory,
                           available_memory_bytes(), o.residency);
    weights_.set_residency(r.memory->residency);
    weights_.set_read_ahead(r.memory->read_ahead);
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
  return g;
}

// Text: prompt (and the negative prompt for CFG) → contexts. The encoder's weights are
// acquired layer by layer and released before denoising starts. The text encoder always
// runs in float32: its 27 layers amplify rounding (8e-2 of the context on the tiny model in
// bf16, against 1e-5).
void Session::encode_prompt(Generation& g, Progress& progress, const TextLayerHook& on_layer) {
  const GenerateOptions& o = g.options;
  timed(g, progress, "text encoder", 0, [&](Phase& phase) {
    const Compute::Use exact(cx_, Arithmetic::exact());
    // A step per layer; with a negative prompt the layers run twice.
    const int passes = g.guided ? 2 : 1;
    int pass = 0;
    const Compute::Reporting layers(cx_, [&](int64_t done, int64_t total) {
      phase.step(int(pass * total + done), int(passes * total));
    });
    qwen3::TextEncoder encoder(weights_, cx_);
    std::optional<qwen3::PromptCache> cache;
    if (o.prompt_cache_dir) cache.emplace(*o.prompt_cache_dir);
    auto encode = [&](const std::string& text, bool& from_cache,
                      const TextLayerHook& observe) {
      KleinPromptTokens tokens = tokenize_klein_prompt(tokenizer_, text);
      if (!tokens.warning.empty()) warn(g, progress, tokens.warning);
      if (observe) {
        from_cache = false;
        return encoder.encode(tokens.ids, tokens.mask, observe);
      }
      auto c = qwen3::encode_with_cache(encoder, cache ? &*cache : nullptr, tokens.ids, tokens.mask);
      if (!c.store_error.empty()) warn(g, progress, "prompt cache: " + c.store_error);
      from_cache = c.from_cache;
      return std::move(c.context);
    };
    g.context = encode(o.prompt, g.result.context_from_cache, on_layer);
    bool unused;
    pass = 1;
    if (g.guided) g.negative = encode(o.negative_prompt, unused, {});
  });
  weights_.release("text_encoder.");
  const Dumper dump(o.dump_dir);
  dump.f32("prompt_embeds", g.context, {1, g.context.dim(0), g.context.dim(1)});
}

// The initial latents (seeded noise or --noise) and the references' clean latent tokens,
// fixed for the whole loop.
void Session::prepare_latents(Generation& g, Progress& progress) {
  const GenerateOptions& o = g.options;
  const Dumper dump(o.dump_dir);
  g.noise = initial_noise(o, g.result.seed.value_or(0), g.grid,
                         weights_.config().transformer.in_channels);
  dump.f32("noise", flux2::unpack_latents(g.noise, g.grid),
           {1, g.noise.dim(1), g.grid.rows, g.grid.cols});
  if (g.init_pixels.numel() > 0) {
    // Image-to-image: the init image's latents, noised to the σ where the kept steps start.
    Tensor image;
    timed(g, progress, "vae encode", 0, [&](Phase& phase) {
      const Compute::Use arithmetic(cx_, arithmetic_for(g.result.fast));
      const Compute::Reporting blocks(cx_, [&](int64_t done, int64_t total) {
        phase.step(int(done), int(total));
      });
      vae::Vae vae(weights_, cx_, g.options.vae_memory);
      image = vae.encode(g.init_pixels);
    });
    weights_.release("vae.encoder");
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
        flux2::make_schedule(weights_.config().scheduler, g.grid.tokens(), g.result.steps);
    const float sigma = schedule.sigmas[size_t(g.first_step)];
    float* x = g.noise.data();
    const float* x0 = image.data();
    for (int64_t i = 0; i < g.noise.numel(); ++i) x[i] = sigma * x[i] + (1.0f - sigma) * x0[i];
    dump.f32("initial_latents", g.noise, {1, g.noise.dim(0), g.noise.dim(1)});
    if (g.inpaint) g.init_latents = std::move(image);
  }

  g.layout = flux2::TokenLayout{};
  g.layout.text_tokens = g.context.dim(0);
  g.layout.target = g.grid;
  if (g.inpaint) {  // the init image is the first condition, before any reference
    Tensor condition(g.init_latents.shape());
    std::memcpy(condition.data(), g.init_latents.data(),
                size_t(condition.numel()) * sizeof(float));
    g.reference_tokens.push_back(std::move(condition));
    g.layout.references.push_back(g.grid);
  }
  if (!g.reference_pixels.empty()) {
    const int n = int(g.reference_pixels.size());
    timed(g, progress, "vae encode", 0, [&](Phase& phase) {
      const Compute::Use arithmetic(cx_, arithmetic_for(g.result.fast));
      vae::Vae vae(weights_, cx_, g.options.vae_memory);
      // A step per encoder block of every reference.
      int i = 0;
      const Compute::Reporting blocks(cx_, [&](int64_t done, int64_t total) {
        phase.step(int(i * total + done), int(n * total));
      });
      for (; i < n; ++i) {
        const Tensor& pixels = g.reference_pixels[size_t(i)];
        g.reference_tokens.push_back(vae.encode(pixels));
        g.layout.references.push_back(
            {pixels.dim(1) / kPixelsPerToken, pixels.dim(2) / kPixelsPerToken});
      }
    });
    weights_.release("vae.encoder");
    g.reference_pixels.clear();
  }
  if (dump.on()) {
    dump.ids("txt_ids", flux2::text_position_ids(g.layout.text_tokens));
    if (weights_.config().reference_cache && !g.layout.references.empty()) {
      // The K/V pipeline: references first at step 0 (as its reference pass sees them), the
      // target alone at every step.
      flux2::TokenLayout target = g.layout, references = g.layout;
      target.references.clear();
      references.target = {};
      std::vector<flux2::PositionId> step0 = flux2::image_position_ids(references);
      const std::vector<flux2::PositionId> image = flux2::image_position_ids(target);
      step0.insert(step0.end(), image.begin(), image.end());
      dump.ids("step0_img_ids", step0);
      dump.ids("img_ids", image);
    } else {
      dump.ids("img_ids", flux2::image_position_ids(g.layout));
    }
    if (!g.reference_tokens.empty()) {
      Tensor all({g.layout.reference_tokens(), g.noise.dim(1)});
      float* p = all.data();
      for (const auto& t : g.reference_tokens) {
        std::memcpy(p, t.data(), size_t(t.numel()) * sizeof(float));
        p += t.numel();
      }
      dump.f32(g.inpaint ? "condition_tokens" : "ref_tokens", all, {1, all.dim(0), all.dim(1)});
    }
  }
}

// The sampler loop, with the transformer (attention and float-weight projections) in the
// generation's arithmetic.
void Session::denoise(Generation& g, Progress& progress, const StepHook& on_step) {
  GenerateResult& r = g.result;
  const Dumper dump(g.options.dump_dir);
  timed(g, progress, "denoise", int(r.steps - g.first_step), [&](Phase& phase) {
    flux2::SamplerInputs in;
    in.context = &g.context;
    in.negative_context = g.guided ? &g.negative : nullptr;
    in.noise = &g.noise;
    in.target = g.grid;
    for (size_t i = 0; i < g.reference_tokens.size(); ++i)
      in.references.push_back({&g.reference_tokens[i], g.layout.references[i]});
    in.schedule = flux2::make_schedule(weights_.config().scheduler, g.grid.tokens(), r.steps);
    if (g.inpaint) {
      // Inpainting: the schedule from where the kept steps start; after each Euler update
      // the unmasked part goes back to the init image, noised to the next step's σ (clean
      // after the last step).
      auto& timesteps = in.schedule.timesteps;
      auto& sigmas = in.schedule.sigmas;
      timesteps.erase(timesteps.begin(), timesteps.begin() + g.first_step);
      sigmas.erase(sigmas.begin(), sigmas.begin() + g.first_step);
      const int64_t run = int64_t(timesteps.size());
      in.after_update = [&g, &sigmas, run](int64_t step, Tensor& latents) {
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
    for (const auto& w : in.schedule.warnings) warn(g, progress, w);
    in.guidance = r.guidance;
    in.adapters = g.adapters.get();
    in.on_step = [&](const flux2::StepInfo& s) {
      if (dump.on()) {
        const std::string p = "step" + std::to_string(s.step) + "_";
        const Shape tokens = {1, s.latents_in.dim(0), s.latents_in.dim(1)};
        dump.f32(p + "timestep", &s.timestep, {1});
        dump.f32(p + "latents_in", s.latents_in, tokens);
        dump.f32(p + "velocity", s.velocity, tokens);
        dump.f32(p + "latents_out", s.latents_out, tokens);
      }
      phase.step(int(s.step + 1), int(s.steps));
      if (on_step)
        on_step(StepView{s.step, s.steps, s.latents_out, s.latents_in, s.timestep, g.grid,
                         s.velocity, s.sigma});
    };
    const Compute::Use arithmetic(cx_, arithmetic_for(r.fast));
    flux2::SamplerResult out = flux2::sample(weights_, in, cx_);
    for (const auto& w : out.warnings) warn(g, progress, w);
    g.latents = std::move(out.latents);
    r.denoise_setup_seconds = out.setup_seconds;
    r.step_seconds = out.step_seconds;
  });
  weights_.release("transformer.");
  dump.f32("final_latents", g.latents, {1, g.latents.dim(0), g.latents.dim(1)});
  g.context = Tensor();
  g.negative = Tensor();
  g.noise = Tensor();
  g.reference_tokens.clear();
  g.init_latents = Tensor();
  g.init_noise = Tensor();
}

// Latents → pixels.
void Session::decode(Generation& g, Progress& progress) {
  const Dumper dump(g.options.dump_dir);
  Tensor decoded;
  timed(g, progress, "vae decode", 0, [&](Phase& phase) {
    const Compute::Use arithmetic(cx_, arithmetic_for(g.result.fast));
    const Compute::Reporting blocks(cx_, [&](int64_t done, int64_t total) {
      phase.step(int(done), int(total));
    });
    vae::Vae vae(weights_, cx_, g.options.vae_memory);
    Tensor z = vae.tokens_to_latent(g.latents, g.grid.rows, g.grid.cols);
    dump.f32("vae_input", z, {1, z.dim(0), z.dim(1), z.dim(2)});
    decoded = vae.decode_latent(z);
  });
  weights_.release("vae.");
  g.latents = Tensor();
  g.result.weights = weights_.residency_stats();
  dump.f32("image_decoded", decoded, {1, decoded.dim(0), decoded.dim(1), decoded.dim(2)});
  g.result.image = tensor_to_image(decoded);
  if (dump.on()) {
    // image.npy: the pipeline's output_type="np", [H, W, 3] in [0, 1].
    const int64_t H = decoded.dim(1), W = decoded.dim(2), plane = H * W;
    std::vector<float> hwc(size_t(plane * 3));
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < plane; ++i) {
        const float u = 0.5f * decoded.data()[c * plane + i] + 0.5f;
        hwc[size_t(i * 3 + c)] = std::min(1.0f, std::max(0.0f, u));
      }
    dump.f32("image", hwc.data(), {H, W, 3});
  }
  g.decoded = std::move(decoded);
  for (const auto& [file, stamp] : g.model_files)
    check(FileStamp::of(file) == stamp, file.string(), " was modified while this generation "
          "read it (rewritten or replaced): the image could mix two versions of the weights, so "
          "none is given; run it again");
}

GenerateResult Session::generate(const GenerateOptions& options, Progress& progress,
                                 const StepHook& on_step) {
  Generation g = start(options, progress);
  if (options.plan_only) return std::move(g.result);
  encode_prompt(g, progress);
  prepare_latents(g, progress);
  denoise(g, progress, on_step);
  decode(g, progress);
  return std::move(g.result);
}

std::string parameters_text(const GenerateOptions& o, const GenerateResult& r,
                            const std::string& model_name) {
  std::ostringstream s;
  s << o.prompt << "\n";
  // Only what took effect: a distilled model (or guidance 1) runs no CFG, so its image owes
  // nothing to a guidance or a negative prompt that was given.
  if (r.guided && !o.negative_prompt.empty())
    s << "Negative prompt: " << o.negative_prompt << "\n";
  s << "Steps: " << r.steps << ", Sampler: Euler (flow matching), CFG scale: "
    << (r.guided ? r.guidance : 1.0f)
    << (r.seed ? ", Seed: " + std::to_string(*r.seed) : std::string(", Noise: from a file"))
    << ", Size: " << r.width << "x" << r.height
    << ", Model: " << model_name;
  if (!o.references.empty()) s << ", References: " << o.references.size();
  if (r.strength) s << ", Denoising strength: " << *r.strength;
  if (!o.mask.empty()) s << ", Mask: " << o.mask.filename().string();
  if (!o.loras.empty()) {
    s << ", LoRA: ";
    for (size_t i = 0; i < o.loras.size(); ++i) s << (i ? " " : "") << lora_label(o.loras[i]);
  }
  s << ", Version: klein " << KLEIN_VERSION;
  return s.str();
}

std::string parameters_json(const GenerateOptions& o, const GenerateResult& r,
                            const std::string& model_name, const std::string& model_checksum) {
  nlohmann::ordered_json j;
  j["prompt"] = o.prompt;
  j["negative_prompt"] = r.guided ? o.negative_prompt : std::string();
  j["steps"] = r.steps;
  j["sampler"] = "euler_flow_matching";
  j["guidance"] = r.guided ? r.guidance : 1.0f;
  j["seed"] = r.seed ? nlohmann::json(*r.seed) : nlohmann::json(nullptr);  // none: --noise
  j["width"] = r.width;
  j["height"] = r.height;
  j["precision"] = precision_name(r.fast);
  j["model"] = model_name;
  if (!model_checksum.empty()) j["model_checksum"] = model_checksum;
  std::vector<std::string> refs;
  for (const auto& p : o.references) refs.push_back(p.filename().string());
  j["references"] = refs;
  if (r.strength) {
    j["init_image"] = o.init_image.filename().string();
    j["strength"] = *r.strength;
    if (!o.mask.empty()) j["mask"] = o.mask.filename().string();
  }
  if (!o.loras.empty()) {
    auto& loras = j["loras"] = nlohmann::ordered_json::array();
    for (const LoraFile& f : o.loras)
      loras.push_back({{"file", f.path.filename().string()}, {"scale", f.scale}});
  }
  j["program"] = std::string("klein ") + KLEIN_VERSION;
  return j.dump();
}

}  // namespace klein
