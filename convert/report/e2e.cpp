#include "convert/report/e2e.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "convert/report/mixed_store.h"
#include "formats/image/preprocess.h"
#include "models/taesd/taesd.h"
#include "pipeline/stages.h"
#include "pipeline/tiny_decoder.h"

namespace klein::report {

namespace {

constexpr int64_t kPixelsPerToken = 16;
constexpr int64_t kDefaultSide = 256;
constexpr int64_t kTestModelSide = 64;
constexpr int64_t kTestModelWidth = 1024;  // transformers narrower than this are test models
constexpr double kMaxDifferenceGain = 64;

struct DefaultCase {
  const char* prompt;
  uint64_t seed;
};
constexpr DefaultCase kDefaultCases[] = {
    {"a red fox in fresh snow, morning light", 42},
    {"a lighthouse on a rocky coast at dusk, oil painting", 7},
};

Tensor copy_of(const Tensor& t) {
  Tensor c(t.shape());
  std::memcpy(c.data(), t.data(), size_t(t.numel()) * sizeof(float));
  return c;
}

std::string case_label(size_t i, size_t n) {
  return n > 1 ? "case " + std::to_string(i + 1) + "/" + std::to_string(n) + ": " : "";
}

// --- generations ----------------------------------------------------------------------------

// Progress of a generation's stages under a label ("case 1/2: reference "), so that the
// reference and candidate runs read apart.
class LabelledProgress : public Progress {
 public:
  LabelledProgress(Progress& inner, std::string label)
      : inner_(inner), label_(std::move(label)) {}
  void begin(const std::string& phase, int total) override { inner_.begin(label_ + phase, total); }
  void step(const std::string& phase, int done, int total) override {
    inner_.step(label_ + phase, done, total);
  }
  void end(const std::string& phase, double seconds) override {
    inner_.end(label_ + phase, seconds);
  }
  void warn(const std::string& message) override { inner_.warn(message); }

 private:
  Progress& inner_;
  std::string label_;
};

// A case as `klein generate` runs it, without the prompt cache, the memory plan or output.
GenerateOptions generation_of(const E2eCase& c, Precision precision) {
  return {.prompt = c.prompt,
          .width = c.width,
          .height = c.height,
          .steps = c.steps,
          .seed = c.seed,
          .plan_memory = false,
          .precision = precision};
}

// --- images ---------------------------------------------------------------------------------

// Decoder output [3, H, W] -> the pixel values the image holds, in [0, 1] (before rounding).
std::vector<float> unit_pixels(const Tensor& decoded) {
  std::vector<float> u(size_t(decoded.numel()));
  for (size_t i = 0; i < u.size(); ++i)
    u[i] = std::clamp(0.5f * decoded.data()[i] + 0.5f, 0.0f, 1.0f);
  return u;
}

// The largest power of two (at most 64) that keeps the largest difference within range, so
// that small errors are visible and the caption can state the factor.
double difference_gain(double max_difference) {
  double gain = 1;
  while (gain < kMaxDifferenceGain && max_difference * gain * 2 <= 1) gain *= 2;
  return gain;
}

Image difference_image(const std::vector<float>& ref, const std::vector<float>& cand, int height,
                       int width, double gain) {
  Image out(width, height);
  const int64_t plane = int64_t(width) * height;
  for (int64_t i = 0; i < plane; ++i)
    for (int c = 0; c < 3; ++c) {
      const size_t k = size_t(c * plane + i);
      const double d = std::min(1.0, std::fabs(double(cand[k]) - ref[k]) * gain);
      out.rgb[size_t(i * 3 + c)] = uint8_t(std::lround(255 * d));
    }
  return out;
}

// --- transformer probes ---------------------------------------------------------------------

// The blocks in order with their units, as the family's stages list them.
std::vector<BlockError> block_list(const std::vector<TransformerBlock>& blocks) {
  std::vector<BlockError> out;
  for (const auto& b : blocks) out.push_back({b.name, b.unit, {}, {}});
  return out;
}

double velocity_nmse(const Tensor& ref, const Tensor& cand) {
  return compare(ref.data(), cand.data(), ref.numel()).nmse;
}

std::vector<std::string> units_starting(WeightStore& store, const std::string& prefix) {
  std::vector<std::string> units;
  for (const auto& u : store.units())
    if (u.starts_with(prefix)) units.push_back(u);
  return units;
}

bool wants_accumulated(BlockProbes p) {
  return p == BlockProbes::Accumulated || p == BlockProbes::Both;
}
bool wants_isolated(BlockProbes p) { return p == BlockProbes::Isolated || p == BlockProbes::Both; }

}  // namespace

// The reference's block outputs, outside the anonymous namespace: ReferenceProbe (a member of
// E2eSession, declared in e2e.h) holds one.
class BlockOutputs {
 public:
  explicit BlockOutputs(size_t blocks) : outputs_(blocks) {}

  BlockObserver recorder() {
    return [this](size_t block, int64_t offset, const float* data, int64_t count) {
      check(block < outputs_.size(), "block probe: no block ", block);
      std::vector<float>& out = outputs_[block];
      if (out.size() < size_t(offset + count)) out.resize(size_t(offset + count));
      std::memcpy(out.data() + offset, data, size_t(count) * sizeof(float));
    };
  }

  // Compares the observed outputs of block `only` (all when none) into `stats`.
  BlockObserver comparer(std::vector<ErrorStats>& stats, std::optional<size_t> only) {
    stats.assign(outputs_.size(), {});
    return [this, &stats, only](size_t block, int64_t offset, const float* data, int64_t count) {
      if (only && block != *only) return;
      check(block < outputs_.size() && outputs_[block].size() >= size_t(offset + count),
            "block probe: no reference output of block ", block);
      stats[block].add(outputs_[block].data() + offset, data, count);
    };
  }

 private:
  std::vector<std::vector<float>> outputs_;
};

// --- the session ------------------------------------------------------------------------------

struct E2eSession::ReferenceCase {
  E2eCase spec;  // steps resolved
  LatentGrid grid;
  Tensor context;
  std::vector<Tensor> layers;        // the stream after every text-encoder layer
  std::vector<Tensor> step_latents;  // after every Euler step
  Tensor latents_at_probe;           // entering the probe step (first case only)
  float probe_timestep = 0;
  float guidance = 1;  // the generation's (FLUX.2-dev gives it to the model)
  Tensor final_latents;
  std::vector<float> pixels;  // [3, H, W] in [0, 1]
  int height = 0, width = 0;
  Image image;
  std::optional<TinyDecoding> tiny;
};

struct E2eSession::ReferenceProbe {
  std::unique_ptr<BlockOutputs> blocks;
  Tensor velocity;
};

E2eSession::E2eSession(WeightStore& reference, const Tokenizer& tokenizer, Compute& cx,
                       E2eOptions options, Progress& progress)
    : reference_(reference),
      tokenizer_(tokenizer),
      cx_(cx),
      stages_(stages_for(reference.config())),
      options_(std::move(options)) {
  check(!options_.cases.empty(), "end-to-end comparison: no cases");
  check(options_.probe_step >= 0, "probe step ", options_.probe_step, ": expected >= 0");
  const ModelConfig& config = reference_.config();
  // Every run goes through the pipeline's stages, as `klein generate` runs them: the same
  // defaults, precision and arithmetic.
  Session session(reference_, tokenizer_, cx_);
  const size_t n = options_.cases.size();
  for (size_t i = 0; i < n; ++i) {
    LabelledProgress labelled(progress, case_label(i, n) + "reference ");
    ReferenceCase c;
    Generation g = session.start(generation_of(options_.cases[i], options_.precision), labelled);
    c.spec = options_.cases[i];
    c.spec.steps = g.result.steps;
    c.guidance = g.result.guidance;
    c.grid = g.grid;
    reference_fast_ = g.result.fast;
    const int64_t probe_step = i == 0 && options_.blocks != BlockProbes::None
                                   ? options_.probe_step : -1;
    check(probe_step < c.spec.steps, "probe step ", probe_step, ": the first case has only ",
          c.spec.steps, " steps (counted from 0)");
    session.encode_prompt(g, labelled, [&](int64_t layer, const Tensor& hidden) {
      if (layer > 0) c.layers.push_back(copy_of(hidden));
    });
    c.context = copy_of(g.context);
    session.prepare_latents(g, labelled);
    session.denoise(g, labelled, [&](const StepView& s) {
      c.step_latents.push_back(copy_of(s.latents));
      if (s.step == probe_step) {
        c.latents_at_probe = copy_of(s.latents_in);
        c.probe_timestep = s.timestep;
      }
    });
    c.final_latents = copy_of(g.latents);
    session.decode(g, labelled);
    c.pixels = unit_pixels(g.decoded);
    c.height = int(g.decoded.dim(1));
    c.width = int(g.decoded.dim(2));
    c.image = std::move(g.result.image);
    if (options_.tiny.on()) c.tiny = tiny_decoding(c.final_latents, c.grid, c.pixels, c.height, c.width);
    cases_.push_back(std::move(c));
  }
  if (options_.blocks != BlockProbes::None) {
    const ReferenceCase& c = cases_[0];
    Phase phase(progress, "reference block outputs");
    probe_ = std::make_unique<ReferenceProbe>();
    probe_->blocks = std::make_unique<BlockOutputs>(stages_.transformer_blocks(config).size());
    const ProbeInputs in{&c.latents_at_probe, &c.context, c.probe_timestep, c.grid, c.guidance};
    const Compute::Use arithmetic(cx_, arithmetic_for(reference_fast_));
    probe_->velocity = stages_.probe_forward(reference_, in, cx_, probe_->blocks->recorder());
  }
}

E2eSession::~E2eSession() = default;

TinyDecoding E2eSession::tiny_decoding(const Tensor& latents, LatentGrid grid,
                                       const std::vector<float>& full, int height, int width) {
  const Compute::Use arithmetic(cx_, arithmetic_for(reference_fast_));
  Tensor decoded =
      options_.tiny.model->decode(stages_.tiny_decoder_input(reference_, latents, grid, cx_), cx_);
  tiny_output_to_signed(decoded);
  check(decoded.dim(1) == height && decoded.dim(2) == width, "the tiny decoder made ",
        decoded.dim(2), "x", decoded.dim(1), " of latents the full decoder made ", width, "x",
        height, " of");
  TinyDecoding t;
  t.file = options_.tiny.model->path().filename().string();
  const std::vector<float> pixels = unit_pixels(decoded);
  const int64_t count = int64_t(pixels.size());
  t.image = report::compare(full.data(), pixels.data(), count);
  t.psnr_db = psnr_db(full.data(), pixels.data(), count);
  t.ssim = ssim(full.data(), pixels.data(), 3, height, width);
  t.tiny_image = tensor_to_image(decoded);
  return t;
}

E2eResult E2eSession::compare(WeightStore& candidate, Progress& progress) {
  E2eResult out;
  const size_t n = cases_.size();
  out.reference_fast = reference_fast_;
  Tensor first_context;  // the candidate's, for the text-encoder probe
  Session session(candidate, tokenizer_, cx_);
  for (size_t i = 0; i < n; ++i) {
    const ReferenceCase& ref = cases_[i];
    LabelledProgress labelled(progress, case_label(i, n) + "candidate ");
    CaseResult r;
    r.spec = ref.spec;
    Generation g = session.start(generation_of(ref.spec, options_.precision), labelled);
    out.candidate_fast = g.result.fast;
    session.encode_prompt(g, labelled, [&](int64_t layer, const Tensor& hidden) {
      if (layer == 0 || size_t(layer) > ref.layers.size()) return;
      const Tensor& x = ref.layers[size_t(layer - 1)];
      r.text_layers.push_back(report::compare(x.data(), hidden.data(), hidden.numel()));
    });
    r.context = report::compare(ref.context.data(), g.context.data(), g.context.numel());
    if (i == 0) first_context = copy_of(g.context);
    session.prepare_latents(g, labelled);
    session.denoise(g, labelled, [&](const StepView& s) {
      const Tensor& x = ref.step_latents[size_t(s.step)];
      r.step_latents.push_back(report::compare(x.data(), s.latents.data(), x.numel()));
    });
    r.final_latents =
        report::compare(ref.final_latents.data(), g.latents.data(), g.latents.numel());
    session.decode(g, labelled);
    const std::vector<float> pixels = unit_pixels(g.decoded);
    const int64_t count = int64_t(pixels.size());
    r.image = report::compare(ref.pixels.data(), pixels.data(), count);
    r.psnr_db = psnr_db(ref.pixels.data(), pixels.data(), count);
    r.ssim = ssim(ref.pixels.data(), pixels.data(), 3, ref.height, ref.width);
    r.reference_image = ref.image;
    r.tiny = ref.tiny;
    r.candidate_image = std::move(g.result.image);
    r.difference_gain = difference_gain(r.image.max_abs);
    r.difference_image =
        difference_image(ref.pixels, pixels, ref.height, ref.width, r.difference_gain);
    out.mean_image_mse += r.image.rmse * r.image.rmse / double(n);
    out.cases.push_back(std::move(r));
  }
  const Arithmetic candidate_arithmetic = arithmetic_for(out.candidate_fast);
  if (probe_) {
    const Compute::Use arithmetic(cx_, candidate_arithmetic);
    out.probe = run_probes(candidate, first_context, progress);
  }
  return out;
}

BlockProbe E2eSession::run_probes(WeightStore& candidate, const Tensor& candidate_context,
                                  Progress& progress) {
  const ReferenceCase& c = cases_[0];
  const BlockProbes mode = options_.blocks;
  BlockProbe probe;
  probe.step = options_.probe_step;
  probe.timestep = c.probe_timestep;
  probe.blocks = block_list(stages_.transformer_blocks(reference_.config()));
  const ProbeInputs in{&c.latents_at_probe, &c.context, c.probe_timestep, c.grid, c.guidance};
  const std::vector<std::string> units = units_starting(candidate, "transformer.");
  const int total = 1 + (wants_accumulated(mode) ? 1 : 0) +
                    (wants_isolated(mode) ? int(units.size()) + 1 : 0);
  Phase phase(progress, "candidate block probes", total);
  int done = 0;
  auto stepped = [&] { phase.step(++done, total); };
  BlockOutputs& ref_blocks = *probe_->blocks;

  if (wants_accumulated(mode)) {
    std::vector<ErrorStats> stats;
    const Tensor v =
        stages_.probe_forward(candidate, in, cx_, ref_blocks.comparer(stats, std::nullopt));
    probe.velocity = report::compare(probe_->velocity.data(), v.data(), v.numel());
    for (size_t b = 0; b < probe.blocks.size(); ++b)
      probe.blocks[b].accumulated = summarize(stats[b]);
    stepped();
  }
  if (wants_isolated(mode)) {
    for (const auto& unit : units) {
      MixedStore mixed(reference_, candidate, {unit});
      const auto block = std::find_if(probe.blocks.begin(), probe.blocks.end(),
                                      [&](const BlockError& b) { return b.unit == unit; });
      // A unit that is no block (the shared one) has only its effect on the velocity.
      const bool is_block = block != probe.blocks.end();
      const size_t index = size_t(block - probe.blocks.begin());
      std::vector<ErrorStats> stats;
      const Tensor v = stages_.probe_forward(
          mixed, in, cx_, is_block ? ref_blocks.comparer(stats, index) : BlockObserver{});
      if (is_block) block->isolated = summarize(stats[index]);
      const double nmse = velocity_nmse(probe_->velocity, v);
      probe.sensitivities.push_back({unit, nmse});
      probe.isolated_velocity_nmse_sum += nmse;
      stepped();
    }
    // The text encoder acts through the context alone: the reference transformer on the
    // candidate's context.
    const ProbeInputs text_in{&c.latents_at_probe, &candidate_context, c.probe_timestep, c.grid,
                              c.guidance};
    const Compute::Use arithmetic(cx_, arithmetic_for(reference_fast_));
    const Tensor v = stages_.probe_forward(reference_, text_in, cx_, {});
    probe.sensitivities.push_back({"text_encoder", velocity_nmse(probe_->velocity, v)});
    stepped();
  }

  // The VAE acts on the image alone: the candidate's decoder on the reference latents.
  const std::vector<std::string> vae = units_starting(candidate, "vae.");
  MixedStore mixed(reference_, candidate, {vae.begin(), vae.end()});
  const std::vector<float> pixels =
      unit_pixels(stages_.decode_latents(mixed, c.final_latents, c.grid, cx_));
  const ErrorSummary e = report::compare(c.pixels.data(), pixels.data(), int64_t(pixels.size()));
  probe.vae_image_mse = e.rmse * e.rmse;
  stepped();
  return probe;
}

std::vector<E2eCase> make_cases(const ModelConfig& config, const std::vector<std::string>& prompts,
                                const std::vector<uint64_t>& seeds, int64_t width,
                                int64_t height, int64_t steps) {
  const int64_t side = stages_for(config).transformer_width(config) < kTestModelWidth
                           ? kTestModelSide : kDefaultSide;
  const int64_t w = width > 0 ? width : side, h = height > 0 ? height : side;
  for (auto [value, what] : {std::pair{w, "width"}, std::pair{h, "height"}})
    check(value >= kPixelsPerToken && value <= 8192 && value % kPixelsPerToken == 0, "image ",
          what, " ", value, ": expected a multiple of 16 from 16 to 8192");
  check(steps >= 0, "steps ", steps, ": expected at least 1");
  std::vector<E2eCase> cases;
  const size_t n = prompts.empty() ? std::size(kDefaultCases) : prompts.size();
  for (size_t i = 0; i < n; ++i) {
    E2eCase c;
    c.prompt = prompts.empty() ? kDefaultCases[i].prompt : prompts[i];
    if (!seeds.empty())
      c.seed = seeds[std::min(i, seeds.size() - 1)];
    else
      c.seed = i < std::size(kDefaultCases) ? kDefaultCases[i].seed : 42 + i;
    c.width = w;
    c.height = h;
    c.steps = steps;
    cases.push_back(c);
  }
  return cases;
}

BlockProbes parse_block_probes(const std::string& s) {
  if (s == "none") return BlockProbes::None;
  if (s == "accumulated") return BlockProbes::Accumulated;
  if (s == "isolated") return BlockProbes::Isolated;
  if (s == "both") return BlockProbes::Both;
  fail("block probes \"", s, "\": expected none, accumulated, isolated or both");
}

std::string block_probes_name(BlockProbes p) {
  switch (p) {
    case BlockProbes::None: return "none";
    case BlockProbes::Accumulated: return "accumulated";
    case BlockProbes::Isolated: return "isolated";
    case BlockProbes::Both: return "both";
  }
  return "";
}

E2eResult run_e2e(WeightStore& reference, WeightStore& candidate, const Tokenizer& tokenizer,
                  Compute& cx, const E2eOptions& options, Progress& progress) {
  E2eSession session(reference, tokenizer, cx, options, progress);
  return session.compare(candidate, progress);
}

}  // namespace klein::report
