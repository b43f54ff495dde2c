#include "pipeline/pipeline.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/memory.h"
#include "core/npy.h"
#include "core/version.h"
#include "formats/image/preprocess.h"
#include "models/flux2/positions.h"
#include "models/flux2/sampler.h"
#include "models/flux2/schedule.h"
#include "models/qwen3/prompt_cache.h"
#include "models/qwen3/text_encoder.h"
#include "models/vae/vae.h"
#include "ops/linear.h"
#include "pipeline/noise.h"
#include "tokenizer/klein_prompt.h"

namespace klein {

namespace fs = std::filesystem;

namespace {

// Output size when neither a size nor a reference is given (the pipeline's
// default_sample_size 128 × VAE scale 8).
constexpr int64_t kDefaultSide = 1024;
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

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

struct Reference {
  Tensor pixels;  // [3, H, W] in [-1, 1], after the official checks, resize and crop
  flux2::LatentGrid grid;
};

std::vector<Reference> load_references(const std::vector<fs::path>& paths) {
  std::vector<Reference> refs;
  for (const auto& p : paths) {
    Reference r;
    r.pixels = load_reference(p);
    r.grid = {r.pixels.dim(1) / kPixelsPerToken, r.pixels.dim(2) / kPixelsPerToken};
    refs.push_back(std::move(r));
  }
  return refs;
}

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
  } else {
    auto values = gaussian_noise(seed, chw.numel());
    std::memcpy(chw.data(), values.data(), values.size() * sizeof(float));
  }
  return flux2::pack_latents(chw);
}

}  // namespace

int64_t floor_to_multiple(int64_t value, int64_t multiple) { return value / multiple * multiple; }

Pipeline::Pipeline(WeightStore& store, const Tokenizer& tokenizer, ThreadPool& pool)
    : store_(store), tokenizer_(tokenizer), pool_(pool) {}

GenerateResult Pipeline::generate(const GenerateOptions& o, Progress& progress) {
  const ModelConfig& config = store_.config();
  GenerateResult r;
  auto warn = [&](const std::string& message) {
    r.warnings.push_back(message);
    progress.warn(message);
  };
  auto timed = [&](const std::string& name, auto&& fn, int total = 0) {
    return_free_memory();  // what the previous phase freed
    const bool exact = reset_peak_rss();
    const uint64_t start_rss = current_rss_bytes();
    {
      Phase phase(progress, name, total);
      fn(phase);
      r.timings.emplace_back(name, phase.seconds());
    }
    r.phase_memory.push_back(
        {name, start_rss, exact ? peak_rss_since_reset() : peak_rss_bytes(), exact});
  };
  store_.reset_peak();
  const Dumper dump(o.dump_dir);

  // Sizes, as the official pipeline picks them.
  std::vector<Reference> refs;
  if (!o.references.empty())
    timed("load references", [&](Phase&) { refs = load_references(o.references); });
  int64_t width = o.width, height = o.height;
  if (width <= 0) width = refs.empty() ? kDefaultSide : refs[0].pixels.dim(2);
  if (height <= 0) height = refs.empty() ? kDefaultSide : refs[0].pixels.dim(1);
  check(width >= kPixelsPerToken && height >= kPixelsPerToken, "image size ", width, "x", height,
        " is too small (at least 16x16)");
  check(width <= 8192 && height <= 8192, "image size ", width, "x", height,
        " is too large (at most 8192 on a side)");
  if (width % kPixelsPerToken || height % kPixelsPerToken) {
    const int64_t w16 = floor_to_multiple(width, kPixelsPerToken);
    const int64_t h16 = floor_to_multiple(height, kPixelsPerToken);
    warn("width and height must be multiples of 16: producing " + std::to_string(w16) + "x" +
         std::to_string(h16) + " instead of " + std::to_string(width) + "x" + std::to_string(height));
    width = w16;
    height = h16;
  }
  r.width = width;
  r.height = height;
  const flux2::LatentGrid grid{height / kPixelsPerToken, width / kPixelsPerToken};
  r.steps = o.steps > 0 ? o.steps : flux2::default_steps(config);
  r.guidance = o.guidance.value_or(config.is_distilled ? 1.0f : 4.0f);
  r.seed = o.seed.value_or(fresh_seed());
  const bool cfg = flux2::uses_guidance(config, r.guidance);
  r.fast = o.precision == Precision::Fast ||
           (o.precision == Precision::Auto && store_.has_quantized("transformer."));

  // Memory: how much this generation needs, resident or paged, against the budget.
  if (o.plan_memory) {
    MemoryPlanInputs need;
    need.width = width;
    need.height = height;
    for (const auto& ref : refs) need.references.emplace_back(ref.pixels.dim(2), ref.pixels.dim(1));
    need.steps = r.steps;
    need.guided = cfg;
    r.memory = plan_memory(estimate_memory(store_, need), o.max_memory, available_memory_bytes(),
                           o.residency);
    store_.set_residency(r.memory->residency);
    progress.memory_plan(*r.memory);
  }
  if (o.plan_only) return r;

  // Text: prompt (and the negative prompt for CFG) → contexts. The encoder's weights are
  // acquired layer by layer inside encode() and released before denoising starts.
  Tensor context, negative;
  timed("text encoder", [&](Phase&) {
    qwen3::TextEncoder encoder(store_, pool_);
    std::optional<qwen3::PromptCache> cache;
    if (o.prompt_cache_dir) cache.emplace(*o.prompt_cache_dir);
    auto encode = [&](const std::string& text, bool& from_cache) {
      KleinPromptTokens tokens = tokenize_klein_prompt(tokenizer_, text);
      if (!tokens.warning.empty()) warn(tokens.warning);
      auto c = qwen3::encode_with_cache(encoder, cache ? &*cache : nullptr, tokens.ids, tokens.mask);
      if (!c.store_error.empty()) warn("prompt cache: " + c.store_error);
      from_cache = c.from_cache;
      return std::move(c.context);
    };
    context = encode(o.prompt, r.context_from_cache);
    bool unused;
    if (cfg) negative = encode(o.negative_prompt, unused);
  });
  store_.release("text_encoder.");
  dump.f32("prompt_embeds", context, {1, context.dim(0), context.dim(1)});

  Tensor noise = initial_noise(o, r.seed, grid, config.transformer.in_channels);
  dump.f32("noise", flux2::unpack_latents(noise, grid), {1, noise.dim(1), grid.rows, grid.cols});

  // References → clean latent tokens, fixed for the whole loop.
  std::vector<Tensor> ref_tokens;
  flux2::TokenLayout layout;
  layout.text_tokens = context.dim(0);
  layout.target = grid;
  if (!refs.empty()) {
    timed("vae encode", [&](Phase& phase) {
      vae::Vae vae(store_, pool_, vae::VaeOptions{.bf16_tiles = r.fast});
      for (size_t i = 0; i < refs.size(); ++i) {
        ref_tokens.push_back(vae.encode(refs[i].pixels));
        layout.references.push_back(refs[i].grid);
        phase.step(int(i + 1), int(refs.size()));
      }
    }, int(refs.size()));
    store_.release("vae.encoder");
    refs.clear();
  }
  if (dump.on()) {
    dump.ids("txt_ids", flux2::text_position_ids(layout.text_tokens));
    dump.ids("img_ids", flux2::image_position_ids(layout));
    if (!ref_tokens.empty()) {
      Tensor all({layout.reference_tokens(), noise.dim(1)});
      float* p = all.data();
      for (const auto& t : ref_tokens) {
        std::memcpy(p, t.data(), size_t(t.numel()) * sizeof(float));
        p += t.numel();
      }
      dump.f32("ref_tokens", all, {1, all.dim(0), all.dim(1)});
    }
  }

  // Denoising.
  Tensor latents;
  timed("denoise", [&](Phase& phase) {
    flux2::SamplerInputs in;
    in.context = &context;
    in.negative_context = cfg ? &negative : nullptr;
    in.noise = &noise;
    in.target = grid;
    for (size_t i = 0; i < ref_tokens.size(); ++i)
      in.references.push_back({&ref_tokens[i], layout.references[i]});
    in.schedule = flux2::make_schedule(config.scheduler, grid.tokens(), r.steps);
    for (const auto& w : in.schedule.warnings) warn(w);
    in.guidance = r.guidance;
    in.transformer.bf16_attention = r.fast;
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
    };
    // The transformer's float weights on bf16 tiles too (the text encoder stays float32: its
    // 27 layers amplify rounding, 8e-2 of the context on the tiny model against 1e-5).
    const ops::FloatWeightsOnTiles tiles(r.fast);
    flux2::SamplerResult out = flux2::sample(store_, in, pool_);
    for (const auto& w : out.warnings) warn(w);
    latents = std::move(out.latents);
    r.denoise_setup_seconds = out.setup_seconds;
    r.step_seconds = out.step_seconds;
  }, int(r.steps));
  store_.release("transformer.");
  dump.f32("final_latents", latents, {1, latents.dim(0), latents.dim(1)});
  context = Tensor();
  negative = Tensor();

  // Latents → pixels.
  Tensor decoded;
  timed("vae decode", [&](Phase&) {
    vae::Vae vae(store_, pool_, vae::VaeOptions{.bf16_tiles = r.fast});
    Tensor z = vae.tokens_to_latent(latents, grid.rows, grid.cols);
    dump.f32("vae_input", z, {1, z.dim(0), z.dim(1), z.dim(2)});
    decoded = vae.decode_latent(z);
  });
  store_.release("vae.");
  r.weights = store_.residency_stats();
  dump.f32("image_decoded", decoded, {1, decoded.dim(0), decoded.dim(1), decoded.dim(2)});
  r.image = tensor_to_image(decoded);
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
  return r;
}

std::string parameters_text(const GenerateOptions& o, const GenerateResult& r,
                            const std::string& model_name) {
  std::ostringstream s;
  s << o.prompt << "\n";
  if (!o.negative_prompt.empty()) s << "Negative prompt: " << o.negative_prompt << "\n";
  s << "Steps: " << r.steps << ", Sampler: Euler (flow matching), CFG scale: " << r.guidance
    << ", Seed: " << r.seed << ", Size: " << r.width << "x" << r.height
    << ", Model: " << model_name;
  if (!o.references.empty()) s << ", References: " << o.references.size();
  s << ", Version: klein " << KLEIN_VERSION;
  return s.str();
}

std::string parameters_json(const GenerateOptions& o, const GenerateResult& r,
                            const std::string& model_name, const std::string& model_checksum) {
  nlohmann::ordered_json j;
  j["prompt"] = o.prompt;
  j["negative_prompt"] = o.negative_prompt;
  j["steps"] = r.steps;
  j["sampler"] = "euler_flow_matching";
  j["guidance"] = r.guidance;
  j["seed"] = r.seed;
  j["width"] = r.width;
  j["height"] = r.height;
  j["precision"] = r.fast ? "fast" : "exact";
  j["model"] = model_name;
  if (!model_checksum.empty()) j["model_checksum"] = model_checksum;
  std::vector<std::string> refs;
  for (const auto& p : o.references) refs.push_back(p.filename().string());
  j["references"] = refs;
  j["program"] = std::string("klein ") + KLEIN_VERSION;
  return j.dump();
}

}  // namespace klein
