#pragma once
// The FLUX.2-klein pipeline, prompt (and reference images) to picture, as the official
// Flux2KleinPipeline does it:
//
//   prompt → chat template → tokens (512) → Qwen3 layers 1..27 → context [512, 3·hidden]
//   seed → noise [128, H/16, W/16] → packed tokens;  references → VAE encode → tokens
//   for each σ: transformer (text | target | references) → velocity → Euler step
//   tokens → unpack, BatchNorm de-normalise, unpatchify → VAE decode → pixels
//
// Each network holds its weights only while it runs, so the text encoder is gone before
// denoising starts and the VAE decoder is loaded only at the end. Before the first one runs,
// the pipeline estimates the memory of this generation (memory_plan.h) and sets the store's
// residency: resident when the budget allows, paged otherwise; after each network it
// releases that network's units (a resident store drops them then).
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"
#include "core/files.h"
#include "core/grid.h"
#include "core/tensor.h"
#include "formats/image/image.h"
#include "models/vae/blocks.h"
#include "ops/compute.h"
#include "pipeline/memory_plan.h"
#include "pipeline/progress.h"
#include "pipeline/safety.h"
#include "pipeline/tiny_decoder.h"
#include "tokenizer/tokenizer.h"
#include "weights/lora.h"
#include "weights/model_source.h"
#include "weights/weight_store.h"

namespace klein {

class FamilyStages;

// The arithmetic of the activations.
//   Exact  float32 everywhere (what the golden tests compare against).
//   Fast   bf16 tiles on CPUs with AMX for the transformer (attention and float-weight
//          projections) and the VAE's convolutions; on AVX-512 BF16 CPUs without AMX (Zen 4)
//          the attention and the VAE's convolutions on bf16 operands (VDPBF16PS); the text
//          encoder stays float32. Other CPUs: exact. Q8 / Q4 projections use their own
//          kernels either way.
//   Auto   Fast when the transformer's weights are quantized (the image is an approximation
//          already), Exact otherwise.
enum class Precision { Auto, Exact, Fast };
const char* precision_name(bool fast);  // "fast" or "exact"

// Whether a generation with these weights runs at the fast precision: the one decision that
// `klein generate`, `klein report` and the library share.
bool runs_fast(Precision requested, const WeightStore& weights);
// The arithmetic of the transformer and the VAE for that decision (the text encoder always
// runs exact).
inline Arithmetic arithmetic_for(bool fast) {
  return fast ? Arithmetic::fast() : Arithmetic::exact();
}

struct GenerateOptions {
  std::string prompt;
  // When `prompt` was rewritten by prompt upsampling (pipeline/upsample.h): the user's
  // prompt, recorded in the image's metadata beside the one that was encoded.
  std::string original_prompt;
  std::string negative_prompt;                    // CFG only (klein-base); "" by default
  int64_t width = 0, height = 0;                  // 0: the first reference's size, else 1024
  int64_t steps = 0;                              // 0: 4 for distilled klein, 50 for base
  std::optional<uint64_t> seed;                   // none: random_seed() (unless noise_file)
  std::optional<float> guidance;                  // none: 4.0 for base, 1.0 for distilled
  std::vector<std::filesystem::path> references;  // reference images for editing, in order
  // Image-to-image (Flux2KleinImg2ImgPipeline): start from this picture instead of pure noise.
  // The output takes its size (floored to multiples of 16) unless width/height are given.
  std::filesystem::path init_image;
  // With init_image: how much of the schedule runs, 0 < s <= 1; int(steps * s) steps run,
  // the last ones, from s0 · noise + (1 - s0) · image (s0: the σ where they start).
  std::optional<double> strength;  // none: the pipeline's default (klein 0.8; Z-Image 0.6, inpainting 1)
  // With init_image: inpainting (Flux2KleinInpaintPipeline): white repaints, black keeps. The
  // init image is also a condition (before any reference), and the output keeps its size.
  std::filesystem::path mask;
  std::filesystem::path noise_file;               // optional [1, 128, H/16, W/16] float32 .npy
  // With init_image and noise_file, for a pipeline that encodes the init image as a posterior
  // sample (Z-Image): its ε, [1, 16, H/8, W/8] float32 .npy (else drawn from the seed).
  std::filesystem::path vae_noise_file;
  // Z-Image's ControlNet (ZImageControlNetPipeline; with init_image and mask,
  // ZImageControlNetInpaintPipeline): the control model (a diffusers directory or the
  // original single file), the control image (an edge map, a depth map, a pose...), and
  // controlnet_conditioning_scale (none: the pipelines' 0.75).
  std::filesystem::path controlnet;
  std::filesystem::path control_image;
  std::optional<float> control_scale;
  // The control image is a picture to take Canny edges from first (formats/image/canny.h), with
  // these low and high thresholds; none: it is the control image itself.
  std::optional<std::pair<double, double>> control_canny;
  std::filesystem::path dump_dir;                 // optional: write every stage as .npy here
  std::optional<std::filesystem::path> prompt_cache_dir;  // none: no prompt cache
  // Memory: plan and set the store's residency (false: leave the store as it is), within
  // max_memory bytes (none: the default budget from the available memory).
  bool plan_memory = true;
  std::optional<uint64_t> max_memory;
  std::optional<Residency> residency;  // force a residency (still checked against max_memory)
  bool plan_only = false;              // stop after the memory plan (result without an image)
  // The images denoised together with this one (Session::denoise of a batch, this one
  // included): the memory plan counts the activations of all of them.
  int64_t batch = 1;
  Precision precision = Precision::Auto;
  // How the VAE decode holds its activations: whole below a limit, else in bands with large
  // tensors in scratch files (under $TMPDIR or /var/tmp by default). Checked before any work.
  vae::VaeMemory vae_memory;
  // LoRA adapters of the transformer, applied beside its weights (weights/lora.h), in order.
  std::vector<LoraFile> loras;
  // Z-Image's guidance options (ZImagePipeline's cfg_normalization and cfg_truncation): with
  // normalization c > 0 the guided prediction is scaled back to c·‖positive‖ when it is
  // longer; steps whose model time (0 at noise, rising to 1) exceeds the truncation run
  // unguided. None: the pipeline's defaults (off, 1.0). FLUX.2-klein refuses them.
  std::optional<float> cfg_normalization;
  std::optional<float> cfg_truncation;
  // The invisible dwtDct mark with BFL's FLUX message on the final pixels
  // (formats/image/watermark.h); images smaller than the method needs stay unmarked.
  bool watermark = true;
  // The image safety check (pipeline/safety.h): with a classifier, the input images are
  // classified in start() and the generated image in decode(); a flagged one stops the
  // generation (SafetyFlagged) or, with SafetyAction::Blur, the output is blurred.
  SafetyOptions safety;
  // The tiny autoencoder (pipeline/tiny_decoder.h): with one, step previews are its pictures;
  // with tiny.decode, it decodes the final latents instead of the model's VAE.
  TinyDecoderOptions tiny;
  // Step caching, diffusers' FirstBlockCache with this threshold (--cache first-block:T): a
  // step whose first transformer layer changed its residual by at most T (relative) since the
  // last step that ran every layer skips the others and reuses their kept residual. None: off.
  // The families that cannot refuse it by name.
  std::optional<double> step_cache;
};

// A step cache as the front ends spell it, "first-block:T" (T a number of 0 or more): its
// threshold. Anything else is refused, naming `option` and what is expected. (Inline: the
// server's request parser, fuzzed on its own, links no pipeline.)
inline double parse_step_cache(std::string_view spec, std::string_view option = "--cache") {
  constexpr std::string_view kMethod = "first-block:";
  auto refuse = [&] {
    fail(option, ": expected first-block:T with a threshold T of 0 or more (e.g. "
         "first-block:0.1), got \"", spec, "\"");
  };
  if (spec.substr(0, kMethod.size()) != kMethod) refuse();
  const std::string number(spec.substr(kMethod.size()));
  size_t used = 0;
  double t = 0;
  try {
    t = std::stod(number, &used);
  } catch (const std::exception&) {
    refuse();
  }
  if (used != number.size() || !std::isfinite(t) || t < 0) refuse();
  return t;
}

// What step caching did (GenerateOptions::step_cache): the transformer calls that ran every
// layer and those that reused the kept residual.
struct StepCacheResult {
  double threshold = 0;
  int64_t computed = 0, skipped = 0;
};
// It as the JSON result and the metadata record it: {"method", "threshold", "computed",
// "skipped"}.
nlohmann::ordered_json step_cache_json(const StepCacheResult& r);

// Peak RSS during one phase.
struct PhaseMemory {
  std::string phase;
  uint64_t start_rss_bytes = 0;  // RSS when the phase started (what earlier phases left)
  uint64_t peak_rss_bytes = 0;
  bool exact = true;  // false: the kernel's mark could not be reset; this is the peak so far
};

struct GenerateResult {
  Image image;
  // The tiny decoder's file name when it decoded the image (options.tiny.decode: --tiny-vae's,
  // or the container's); empty: the model's VAE.
  std::string tiny_decoder;
  std::optional<StepCacheResult> step_cache;  // with GenerateOptions::step_cache
  std::optional<double> strength;  // image-to-image only
  std::optional<uint64_t> seed;  // none when the noise came from a file
  int64_t width = 0, height = 0, steps = 0;
  float guidance = 1;
  bool guided = false;  // guidance took effect: CFG with the negative prompt (base models, > 1)
  // The guidance value that means none in the family's convention (klein 1, Z-Image 0): what
  // the metadata records when no guidance took effect, so that giving it back gives the image.
  float no_guidance = 1;
  // FLUX.2-dev: the guidance value went to the model's guidance embedder (no CFG pass), so it
  // shaped the image and is recorded.
  bool embedded_guidance = false;
  bool context_from_cache = false;
  bool fast = false;  // the precision used: true = Fast (see Precision)
  std::vector<std::pair<std::string, double>> timings;  // phase → seconds, in order
  double denoise_setup_seconds = 0;   // embeddings and all steps' modulation, before step 0
  std::vector<double> step_seconds;   // each denoising step
  std::vector<PhaseMemory> phase_memory;  // peak RSS per phase, in order
  std::optional<MemoryPlan> memory;       // when options.plan_memory
  ResidencyStats weights;                 // units resident at once: the peak over the run
  // Whether the image carries the invisible mark, and why not when it does not.
  bool watermarked = false;
  std::string watermark_note;
  // The safety check's verdicts, when options.safety.on() (for the metadata).
  std::optional<SafetyReport> safety;
  std::vector<std::string> warnings;
};

// The most denoising steps a generation takes (the official pipelines use 4 and 50).
constexpr int64_t kMaxSteps = 1000;

// The size the pipeline produces for a requested size: floored to multiples of 16.
int64_t floor_to_multiple(int64_t value, int64_t multiple);

// An opened model: the weights (mapped, paged in on demand) and the tokenizer. Opened once
// and used for any number of generations, one at a time.
struct Model {
  std::unique_ptr<WeightStore> weights;
  Tokenizer tokenizer;
  std::string name;      // the configuration's name, for image metadata
  std::string checksum;  // the container's identity; empty for a source checkpoint

  static Model open(const ModelPaths& paths);
};

// One generation between the stages: what was decided before the long work started, and
// what each stage has produced so far. A caller runs the stages in order; each leaves its
// outputs here and releases what the next ones do not need.
struct Generation {
  GenerateOptions options;
  GenerateResult result;  // sizes, steps, seed, precision, memory plan; timings as they run
  LatentGrid grid;
  bool guided = false;    // classifier-free guidance runs (klein-base with guidance > 1)

  // encode_prompt
  Tensor context, negative;  // [T, 3·hidden]; negative only when guided
  // prepare_latents
  Tensor noise_from_file;                // [C, h, w]: --noise, read and checked in start
  Tensor noise;                          // [N, 128] packed initial latents
  std::vector<Tensor> reference_tokens;  // [n_i, 128] clean latents of each reference
  // denoise
  Tensor latents;  // [N, 128]
  // decode
  Tensor decoded;  // [3, H, W], the VAE's output in [-1, 1] before it became result.image
  // The model's files as start found them; decode refuses to finish when one has changed
  // since (rewritten or replaced under the mapping: the image could mix two models).
  std::vector<std::pair<std::filesystem::path, FileStamp>> model_files;

  std::shared_ptr<const Adapters> adapters;  // start: the LoRAs, read and checked (or null)
  std::vector<Tensor> reference_pixels;  // loaded and checked by start, encoded by prepare
  Tensor init_pixels;                    // image-to-image: [3, H, W], encoded by prepare
  int64_t first_step = 0;                // image-to-image: schedule steps skipped
  // inpainting: the latent mask [N] (1: repaint), and from prepare the init image's clean
  // latents and the noise, to put the unmasked part back after every step
  bool inpaint = false;
  std::vector<float> mask_latents;
  Tensor init_latents, init_noise;

  // What a family's stages keep between stages beyond the fields above (stages.h).
  struct FamilyState {
    virtual ~FamilyState() = default;
  };
  std::shared_ptr<FamilyState> family;
};

// What the denoising loop shows a caller after each step (the Euler update done), besides
// Progress::step: the latents, for previews. Called on the session's thread.
struct StepView {
  int64_t step = 0, steps = 0;
  const Tensor& latents;     // after the step: FLUX.2 [N, 128] packed, Z-Image [16, h, w]
  const Tensor& latents_in;  // the same before the step
  float timestep = 0;        // the scheduler's timestep at this step (σ · 1000)
  LatentGrid grid;           // tokens of 16x16 pixels
  const Tensor& velocity;    // what the Euler update used (after guidance)
  float sigma = 0;           // σ of the update: x0 is estimated as latents_in − σ·velocity
  // A quick look at the image this step points to: the colour fit of preview.h, or with a
  // tiny decoder (GenerateOptions::tiny) its picture (tiny_decoder.h).
  std::function<Image()> preview;
};
using StepHook = std::function<void(const StepView&)>;

// What the text encoder shows a caller of encode_prompt: the hidden state after each layer
// (0: the embeddings) while it encodes the prompt (not the negative prompt).
using TextLayerHook = std::function<void(int64_t layer, const Tensor& hidden)>;

// The stages of the FLUX.2-klein pipeline over one model and one compute context:
//
//   start            options → sizes, steps, guidance, seed, precision, memory plan; references
//                    loaded and checked. Everything that can be checked is, before any
//                    network runs; then, with options.safety, the safety classifier on the
//                    input images (a flagged one: SafetyFlagged).
//   encode_prompt    prompt (and negative prompt) → context, with the prompt cache (a
//                    TextLayerHook sees every layer; with one, the cache is not read)
//   prepare_latents  seed or --noise → initial latents; references → VAE encode → tokens
//   denoise          the sampler loop; Progress per step, the StepHook for previews, the
//                    context's cancel flag checked between blocks
//   decode           latents → VAE decode (or the tiny decoder: options.tiny.decode) → the
//                    image (with options.safety, classified:
//                    SafetyFlagged, or blurred) → the invisible mark
//
// generate() runs them all. Cancelling (Compute::cancel, from any thread) makes the running
// stage throw Cancelled; nothing is written.
class Session {
 public:
  // All three must outlive the session.
  Session(WeightStore& weights, const Tokenizer& tokenizer, Compute& cx);
  Session(Model& model, Compute& cx) : Session(*model.weights, model.tokenizer, cx) {}

  Compute& compute() { return cx_; }
  WeightStore& weights() { return weights_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }

  Generation start(const GenerateOptions& options, Progress& progress);
  void encode_prompt(Generation& g, Progress& progress, const TextLayerHook& on_layer = {});
  void prepare_latents(Generation& g, Progress& progress);
  void denoise(Generation& g, Progress& progress, const StepHook& on_step = {});
  // Generations started with the same options but their prompts and seeds (and
  // options.batch = their number, for the memory plan), denoised together where the family
  // can (FamilyStages::denoise_batch): each image is the one denoise() makes alone.
  // `on_first` sees the first one's steps (a preview).
  void denoise(std::span<Generation* const> batch, Progress& progress,
               const StepHook& on_first = {});
  // How many of n generations with these options (prompts and seeds aside) fit the memory
  // budget denoised together: n, or n halved until their plan fits; 1 at least (a single
  // image's own refusal is start()'s). Plans only; runs nothing.
  int64_t batch_that_fits(const GenerateOptions& options, int64_t n);
  void decode(Generation& g, Progress& progress);

  GenerateResult generate(const GenerateOptions& options, Progress& progress,
                          const StepHook& on_step = {});
  // Several images whose options differ only in their prompts and seeds (options.batch is
  // set here): in groups that the memory budget holds denoised together (batch_that_fits;
  // usually all of them), each group started (every option checked before any network
  // runs), its prompts encoded (once per distinct prompt over the whole call), prepared,
  // denoised as one batch and decoded. `started(first, count)` is called after a group's
  // starts; `done(i, result)` gets image i as soon as it is decoded, in order; `on_first`
  // sees the steps of each group's first image. Each image is the one generate() makes with
  // its options.
  using BatchStarted = std::function<void(size_t first, size_t count)>;
  using BatchDone = std::function<void(size_t index, GenerateResult& result)>;
  void generate_batch(std::span<const GenerateOptions> images, Progress& progress,
                      const BatchDone& done, const StepHook& on_first = {},
                      const BatchStarted& started = {});

  // For the stages (stages.h): run a phase, timed and with its peak memory; record a warning.
  template <class Fn>
  void timed(Generation& g, Progress& progress, const std::string& name, int total, Fn&& fn);
  void warn(Generation& g, Progress& progress, const std::string& message);

 private:
  WeightStore& weights_;
  const Tokenizer& tokenizer_;
  Compute& cx_;
  const FamilyStages& stages_;
  // The tiny decoder the container holds (stored_tiny_decoder), read when a generation without
  // one of its own first needs it: to decode (--decoder tiny) or for a step's preview picture.
  std::optional<std::shared_ptr<const taesd::TinyDecoder>> stored_tiny_;
  // g's tiny decoder: its own, else the container's (read now if not yet); false: none.
  bool take_stored_tiny_decoder(Generation& g);

  // on_step with previews by the tiny decoder when g's options have one or the container holds
  // one (read at the first preview asked for).
  StepHook with_tiny_preview(Generation& g, const StepHook& on_step);
  void decode_tiny(Generation& g, Progress& progress);
};

// Marks result.image as options.watermark asks (Session::decode calls it), and records in
// the result whether it carries the mark, or the note why not.
void mark_image(const GenerateOptions& options, GenerateResult& result);

// The A1111-style "parameters" text and a JSON description of a generation, for the
// image file's metadata.
std::string parameters_text(const GenerateOptions& options, const GenerateResult& result,
                            const std::string& model_name);
std::string parameters_json(const GenerateOptions& options, const GenerateResult& result,
                            const std::string& model_name, const std::string& model_checksum);

// What a model's pipelines take beyond a prompt, size, steps and seed: front ends show only
// these (the web page, /health), and the stages refuse the others by name.
struct Capabilities {
  std::string family;               // ModelConfig::family: "flux2-klein", "z-image"
  bool references = false;          // reference images to edit from
  bool image_to_image = false;      // an init image (and a mask: inpainting)
  bool guidance = false;            // a guidance value takes effect (CFG, or dev's embedded)
  bool negative_prompt = false;     // classifier-free guidance runs with a negative prompt
  bool guidance_options = false;    // cfg_normalization and cfg_truncation (Z-Image)
  bool step_cache = false;          // GenerateOptions::step_cache (Z-Image)
  bool loras = false;
  bool control = false;             // a control model and image (Z-Image's ControlNet)
  bool stored_control_model = false;  // the container holds one (klein convert --controlnet)
  std::string stored_tiny_decoder;    // the source of the container's (convert --tiny-vae)
  int64_t default_steps = 0;        // the steps and guidance a request without them gets
  float default_guidance = 1;
};
Capabilities capabilities(const Model& model);

// The XMP packet that says an image was made by a generative model, for every image the
// engine writes (image metadata key kXmpKey): IPTC's digital source type
// trainedAlgorithmicMedia (compositeWithTrainedAlgorithmicMedia for an edit of given images:
// references or an init image), IPTC 2025.1's AI System Used (the model) and AI Prompt
// Information (the prompt, and the negative prompt when one took effect), and the software
// as xmp:CreatorTool; built from the JSON parameters_json makes.
std::string provenance_xmp(const std::string& metadata_json);

}  // namespace klein
