// The C library (include/klein/klein.h) over the pipeline stages: it checks the arguments,
// turns the C structs into GenerateOptions, runs a Session and turns the result and every
// exception into C values. No logic of its own.
#include "klein/klein.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "core/version.h"
#include "families/registry.h"
#include "formats/image/image.h"
#include "ops/compute.h"
#include "pipeline/noise.h"
#include "pipeline/pipeline.h"
#include "pipeline/preview.h"
#include "pipeline/prompt_check.h"

struct klein_model {
  klein::Model model;
  std::mutex generating;  // one generation at a time per model (its residency and paging)
};

struct klein_session {
  klein_model* model = nullptr;
  klein_session_options options{};
  std::unique_ptr<klein::Compute> cx;
  std::string prompt_cache_dir;
  std::string error;
  // The safety classifier of params.safety_model, opened on first use and kept while the
  // path stays the same.
  std::string safety_path;
  std::shared_ptr<const klein::SafetyModel> safety;
  // The tiny decoder of params.tiny_vae, the same way.
  std::string tiny_path;
  std::shared_ptr<const klein::taesd::TinyDecoder> tiny;
};

namespace {

char* copy_string(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

void set_error(char** error, const std::string& message) {
  if (error) *error = copy_string(message);
}

// Runs fn, turning exceptions into a status and a message.
template <class Fn>
klein_status guarded(std::string& message, Fn&& fn) {
  try {
    fn();
    message.clear();
    return KLEIN_OK;
  } catch (const klein::Cancelled&) {
    message = "cancelled";
    return KLEIN_ERROR_CANCELLED;
  } catch (const klein::SafetyFlagged& e) {
    message = e.what();
    return KLEIN_ERROR_FLAGGED;
  } catch (const klein::PromptFlagged& e) {
    message = e.what();
    return KLEIN_ERROR_FLAGGED;
  } catch (const std::bad_alloc&) {
    message = "out of memory";
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown error";
  }
  return KLEIN_ERROR;
}

// A float as the double its shortest decimal reads as (0.6f: 0.6).
double shortest_decimal(float value) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  return std::strtod(std::string(text, end).c_str(), nullptr);
}

// The C progress callback as the pipeline's Progress; a non-zero return cancels.
class CallbackProgress final : public klein::Progress {
 public:
  CallbackProgress(const klein_generate_params& p, klein::Compute& cx) : p_(p), cx_(cx) {}
  void begin(const std::string& phase, int total) override {
    started_ = std::chrono::steady_clock::now();
    call(phase, 0, total);
  }
  void step(const std::string& phase, int done, int total) override { call(phase, done, total); }
  void end(const std::string& phase, double) override { call(phase, -1, 0); }

 private:
  void call(const std::string& phase, int done, int total) {
    if (!p_.progress) return;
    klein_progress info;
    info.phase = phase.c_str();
    info.done = done < 0 ? total : done;
    info.total = total;
    info.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    if (p_.progress(&info, p_.user_data) != 0) cx_.cancel();
  }
  const klein_generate_params& p_;
  klein::Compute& cx_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

klein::GenerateOptions to_options(klein_session& s, const klein_generate_params& p) {
  using klein::check;
  check(p.prompt != nullptr, "params.prompt: a prompt is required (\"\" for the empty prompt)");
  check(p.width == 0 || (p.width >= 16 && p.width <= 8192), "params.width: expected 0 or 16 to ",
        "8192, got ", p.width);
  check(p.height == 0 || (p.height >= 16 && p.height <= 8192), "params.height: expected 0 or ",
        "16 to 8192, got ", p.height);
  check(p.steps >= 0 && p.steps <= klein::kMaxSteps, "params.steps: expected 0 to ",
        klein::kMaxSteps, ", got ", p.steps);
  check(std::isfinite(p.guidance) && p.guidance <= 100, "params.guidance: expected a number ",
        "up to 100 (negative: the model's default), got ", p.guidance);
  check(p.reference_count >= 0 && (p.reference_count == 0 || p.references != nullptr),
        "params.references: ", p.reference_count, " references but no array");
  klein::GenerateOptions o;
  o.prompt = p.prompt;
  if (p.negative_prompt) o.negative_prompt = p.negative_prompt;
  o.width = p.width;
  o.height = p.height;
  o.steps = p.steps;
  if (p.guidance >= 0) o.guidance = p.guidance;
  check(!std::isinf(p.cfg_normalization) && !std::isnan(p.cfg_normalization),
        "params.cfg_normalization: expected a number (negative: not given), got ",
        p.cfg_normalization);
  if (p.cfg_normalization >= 0) o.cfg_normalization = p.cfg_normalization;
  check(!std::isinf(p.cfg_truncation), "params.cfg_truncation: expected a number (NAN: not "
        "given), got ", p.cfg_truncation);
  if (!std::isnan(p.cfg_truncation)) o.cfg_truncation = p.cfg_truncation;
  o.watermark = p.no_watermark == 0;
  if (p.has_seed) o.seed = p.seed;
  for (int i = 0; i < p.reference_count; ++i) {
    check(p.references[i] != nullptr, "params.references[", i, "] is NULL");
    o.references.emplace_back(p.references[i]);
  }
  if (p.init_image) o.init_image = p.init_image;
  if (p.mask) o.mask = p.mask;
  if (p.controlnet) o.controlnet = p.controlnet;
  if (p.control_image) o.control_image = p.control_image;
  check(!std::isinf(p.control_scale), "params.control_scale: expected a number (NAN: not given)");
  if (!std::isnan(p.control_scale)) o.control_scale = p.control_scale;
  if (p.cache) o.step_cache = klein::parse_step_cache(p.cache, "params.cache");
  check(std::isfinite(p.strength) && p.strength >= 0 && p.strength <= 1, "params.strength: "
        "expected 0 (the default) or a number in (0, 1], got ", p.strength);
  // The float's shortest decimal (0.6f is 0.6, as the CLI reads "0.6"), so that the steps
  // strength picks and the metadata are the CLI's.
  if (p.strength > 0) o.strength = shortest_decimal(p.strength);
  check(p.lora_count >= 0 && (p.lora_count == 0 || p.loras != nullptr), "params.loras: ",
        p.lora_count, " LoRAs but no array");
  for (int i = 0; i < p.lora_count; ++i) {
    check(p.loras[i] != nullptr, "params.loras[", i, "] is NULL");
    const float scale = p.lora_scales ? p.lora_scales[i] : 1.0f;
    check(std::isfinite(scale), "params.lora_scales[", i, "]: expected a finite number");
    o.loras.push_back({p.loras[i], scale});
  }
  check(std::isfinite(p.safety_threshold) && p.safety_threshold <= 1,
        "params.safety_threshold: expected a number in [0, 1] (negative: 0.85), got ",
        p.safety_threshold);
  check(p.safety_action == KLEIN_SAFETY_REFUSE || p.safety_action == KLEIN_SAFETY_BLUR,
        "params.safety_action: expected KLEIN_SAFETY_REFUSE or KLEIN_SAFETY_BLUR, got ",
        int(p.safety_action));
  check(p.safety_model || (p.safety_threshold < 0 && p.safety_action == KLEIN_SAFETY_REFUSE),
        "params.safety_threshold and safety_action need params.safety_model (the classifier)");
  if (p.safety_model) {
    if (!s.safety || s.safety_path != p.safety_model) {
      s.safety = nullptr;  // a new path: the old classifier goes first
      s.safety = klein::open_shared_safety_model(p.safety_model, "params.safety_model");
      s.safety_path = p.safety_model;
    }
    o.safety.model = s.safety;
    // The float's shortest decimal, as the CLI reads "0.3" (see strength below).
    if (p.safety_threshold >= 0) o.safety.threshold = shortest_decimal(p.safety_threshold);
    o.safety.action =
        p.safety_action == KLEIN_SAFETY_BLUR ? klein::SafetyAction::Blur : klein::SafetyAction::Refuse;
  }
  // tiny_decode without tiny_vae: the container's tiny decoder (the generation refuses it when
  // the model holds none).
  check(p.preview_size == 0 || (p.preview_size >= 8 && p.preview_size <= 8192),
        "params.preview_size: expected 0 (256) or 8 to 8192, got ", p.preview_size);
  if (p.tiny_vae) {
    if (!s.tiny || s.tiny_path != p.tiny_vae) {
      s.tiny = nullptr;
      s.tiny = klein::open_shared_tiny_decoder(p.tiny_vae, "params.tiny_vae");
      s.tiny_path = p.tiny_vae;
    }
    o.tiny.model = s.tiny;
  }
  o.tiny.decode = p.tiny_decode != 0;
  if (p.preview_size) o.tiny.preview_size = p.preview_size;
  if (!s.prompt_cache_dir.empty()) o.prompt_cache_dir = s.prompt_cache_dir;
  if (s.options.max_memory) o.max_memory = s.options.max_memory;
  if (s.options.residency == KLEIN_RESIDENCY_PAGED) o.residency = klein::Residency::Paged;
  if (s.options.residency == KLEIN_RESIDENCY_RESIDENT) o.residency = klein::Residency::Resident;
  o.precision = s.options.precision == KLEIN_PRECISION_EXACT  ? klein::Precision::Exact
                : s.options.precision == KLEIN_PRECISION_FAST ? klein::Precision::Fast
                                                               : klein::Precision::Auto;
  return o;
}


// The preview callback of the params as a step hook (none without one); a non-zero return
// cancels.
klein::StepHook preview_hook(klein_session& session, const klein_generate_params& params) {
  if (!params.preview) return {};
  return [&params, &session](const klein::StepView& s) {
    const klein::Image image = s.preview();
    const klein_preview info{int(s.step + 1), int(s.steps), image.width, image.height,
                             image.rgb.data()};
    if (params.preview(&info, params.user_data) != 0) session.cx->cancel();
  };
}

// A generation's image as the C library hands it over (malloc'd; klein_image_free).
klein_image* to_image(const klein::GenerateOptions& o, const klein::GenerateResult& r,
                      const klein_model& m) {
  const std::string parameters = klein::parameters_text(o, r, m.model.name);
  const std::string metadata = klein::parameters_json(o, r, m.model.name, m.model.checksum);
  auto* out = static_cast<klein_image*>(std::calloc(1, sizeof(klein_image)));
  if (!out) throw std::bad_alloc();
  out->width = r.image.width;
  out->height = r.image.height;
  out->channels = 3;
  out->seed = r.seed.value_or(0);
  out->steps = int(r.steps);
  out->guidance = r.guidance;
  out->pixels = static_cast<uint8_t*>(std::malloc(r.image.rgb.size()));
  out->parameters = copy_string(parameters);
  out->metadata = copy_string(metadata);
  if (!out->pixels || !out->parameters || !out->metadata) {
    klein_image_free(out);
    throw std::bad_alloc();
  }
  std::memcpy(out->pixels, r.image.rgb.data(), r.image.rgb.size());
  return out;
}

// The most images one klein_generate_batch makes (as `klein generate --batch`).
constexpr int kMaxBatch = 1000;

// params.check_prompt: the prompt asked about before any work (as generate
// --check-prompt); a flagged one throws PromptFlagged.
void check_prompt_if_asked(klein_session& s, const klein_generate_params& p,
                           const std::string& prompt) {
  if (!p.check_prompt) return;
  klein_model& m = *s.model;
  const std::string why = klein::prompt_check_unavailable(m.model);
  klein::check(why.empty(), "params.check_prompt: ", why);
  // BFL's fixed text's keys and values from the session's prompt cache when it has one.
  std::optional<std::filesystem::path> cache;
  if (!s.prompt_cache_dir.empty()) cache = s.prompt_cache_dir;
  const klein::PromptCheck c = klein::check_prompt(m.model, *s.cx, prompt, cache);
  if (c.flagged)
    throw klein::PromptFlagged(klein::prompt_check_refusal("params.check_prompt"), c);
}

}  // namespace

extern "C" {

const char* klein_version(void) { return KLEIN_VERSION; }

void klein_string_free(char* s) { std::free(s); }

void klein_model_options_init(klein_model_options* options) {
  if (options) *options = klein_model_options{};
}

klein_status klein_model_open(const char* path, const klein_model_options* options,
                              klein_model** model, char** error) {
  if (error) *error = nullptr;
  if (!model) {
    set_error(error, "klein_model_open: model is NULL");
    return KLEIN_ERROR_ARGUMENT;
  }
  *model = nullptr;
  std::string message;
  const klein_status status = guarded(message, [&] {
    klein::register_built_in_families();  // libklein.a: nothing else links the table in
    klein::ModelPaths paths;
    if (path) paths.model = path;
    if (options) {
      if (options->diffusion_model) paths.diffusion_model = options->diffusion_model;
      if (options->text_encoder) paths.text_encoder = options->text_encoder;
      if (options->vae) paths.vae = options->vae;
      if (options->tokenizer) paths.tokenizer = options->tokenizer;
    }
    klein::check(!paths.model.empty() || !paths.diffusion_model.empty(),
                 "klein_model_open: no model path and no single files");
    *model = new klein_model{klein::Model::open(paths), {}};
  });
  if (status != KLEIN_OK) set_error(error, message);
  return status;
}

void klein_model_free(klein_model* model) { delete model; }

const char* klein_model_name(const klein_model* model) {
  return model ? model->model.name.c_str() : "";
}

void klein_session_options_init(klein_session_options* options) {
  if (options) *options = klein_session_options{};
}

klein_status klein_session_new(klein_model* model, const klein_session_options* options,
                               klein_session** session, char** error) {
  if (error) *error = nullptr;
  if (!model || !session) {
    set_error(error, "klein_session_new: model and session must not be NULL");
    return KLEIN_ERROR_ARGUMENT;
  }
  *session = nullptr;
  std::string message;
  const klein_status status = guarded(message, [&] {
    auto s = std::make_unique<klein_session>();
    s->model = model;
    klein_session_options_init(&s->options);
    if (options) s->options = *options;
    klein::check(s->options.threads >= 0 && s->options.threads <= klein::kMaxThreads,
                 "options.threads: expected 0 to ", klein::kMaxThreads, ", got ",
                 s->options.threads);
    if (s->options.prompt_cache_dir) s->prompt_cache_dir = s->options.prompt_cache_dir;
    s->options.prompt_cache_dir = nullptr;  // the copy above is what is used
    s->cx = std::make_unique<klein::Compute>(s->options.threads);
    *session = s.release();
  });
  if (status != KLEIN_OK) set_error(error, message);
  return status;
}

void klein_session_free(klein_session* session) { delete session; }

const char* klein_session_error(const klein_session* session) {
  return session ? session->error.c_str() : "klein_session_error: session is NULL";
}

void klein_session_cancel(klein_session* session) {
  if (session && session->cx) session->cx->cancel();
}

void klein_generate_params_init(klein_generate_params* params) {
  if (!params) return;
  *params = klein_generate_params{};
  params->guidance = -1;
  params->cfg_normalization = -1;
  params->cfg_truncation = std::numeric_limits<float>::quiet_NaN();
  params->safety_threshold = -1;
  params->safety_action = KLEIN_SAFETY_REFUSE;
  params->control_scale = std::numeric_limits<float>::quiet_NaN();
}

klein_status klein_generate(klein_session* session, const klein_generate_params* params,
                            klein_image** image) {
  if (!session) return KLEIN_ERROR_ARGUMENT;
  if (!params || !image) {
    session->error = "klein_generate: params and image must not be NULL";
    return KLEIN_ERROR_ARGUMENT;
  }
  *image = nullptr;
  return guarded(session->error, [&] {
    const klein::GenerateOptions o = to_options(*session, *params);
    klein_model& m = *session->model;
    klein::GenerateResult r;
    {
      const std::lock_guard lock(m.generating);
      check_prompt_if_asked(*session, *params, o.prompt);
      CallbackProgress progress(*params, *session->cx);
      klein::Session stages(m.model, *session->cx);
      r = stages.generate(o, progress, preview_hook(*session, *params));
    }
    *image = to_image(o, r, m);
  });
}

klein_status klein_generate_batch(klein_session* session, const klein_generate_params* params,
                                  int count, klein_image** images) {
  if (!session) return KLEIN_ERROR_ARGUMENT;
  if (!params || !images) {
    session->error = "klein_generate_batch: params and images must not be NULL";
    return KLEIN_ERROR_ARGUMENT;
  }
  if (count < 1 || count > kMaxBatch) {
    session->error = "klein_generate_batch: count must be 1 to " + std::to_string(kMaxBatch) +
                     ", got " + std::to_string(count);
    return KLEIN_ERROR_ARGUMENT;
  }
  std::vector<klein_image*> made;
  const klein_status status = guarded(session->error, [&] {
    klein::GenerateOptions o = to_options(*session, *params);
    if (!o.seed) o.seed = klein::random_seed();
    std::vector<klein::GenerateOptions> all(size_t(count), o);
    for (int i = 0; i < count; ++i) all[size_t(i)].seed = *o.seed + uint64_t(i);
    klein_model& m = *session->model;
    const std::lock_guard lock(m.generating);
    check_prompt_if_asked(*session, *params, o.prompt);
    CallbackProgress progress(*params, *session->cx);
    klein::Session stages(m.model, *session->cx);
    stages.generate_batch(all, progress, [&](size_t i, klein::GenerateResult& r) {
      made.push_back(to_image(all[i], r, m));
    }, preview_hook(*session, *params));
  });
  if (status != KLEIN_OK) {
    for (klein_image* image : made) klein_image_free(image);
    return status;
  }
  for (size_t i = 0; i < made.size(); ++i) images[i] = made[i];
  return status;
}

void klein_image_free(klein_image* image) {
  if (!image) return;
  std::free(image->pixels);
  std::free(const_cast<char*>(image->parameters));
  std::free(const_cast<char*>(image->metadata));
  std::free(image);
}

klein_status klein_image_save(const klein_image* image, const char* path, char** error) {
  if (error) *error = nullptr;
  if (!image || !path || !image->pixels || image->channels != 3) {
    set_error(error, "klein_image_save: image (RGB) and path must not be NULL");
    return KLEIN_ERROR_ARGUMENT;
  }
  std::string message;
  const klein_status status = guarded(message, [&] {
    klein::Image img;
    img.width = image->width;
    img.height = image->height;
    img.rgb.assign(image->pixels, image->pixels + size_t(image->width) * image->height * 3);
    klein::ImageMetadata meta;
    if (image->parameters) meta.emplace_back("parameters", image->parameters);
    if (image->metadata) {
      meta.emplace_back("klein", image->metadata);
      meta.emplace_back(klein::kXmpKey, klein::provenance_xmp(image->metadata));
    }
    klein::save_image(path, img, meta);
  });
  if (status != KLEIN_OK) set_error(error, message);
  return status;
}

}  // extern "C"
