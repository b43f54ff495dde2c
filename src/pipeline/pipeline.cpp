#include "pipeline/pipeline.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/memory.h"
#include "core/version.h"
#include "formats/image/preprocess.h"
#include "formats/image/watermark.h"
#include "models/taesd/taesd.h"
#include "pipeline/dump.h"
#include "pipeline/model_tokenizer.h"
#include "pipeline/stages.h"

namespace klein {

namespace fs = std::filesystem;

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
  Tokenizer tokenizer = load_model_tokenizer(paths, weights.get());
  Model m{std::move(weights), std::move(tokenizer), "", ""};
  m.name = m.weights->config().name;
  if (fs::is_regular_file(paths.model)) m.checksum = m.weights->identity();
  return m;
}

Session::Session(WeightStore& weights, const Tokenizer& tokenizer, Compute& cx)
    : weights_(weights), tokenizer_(tokenizer), cx_(cx), stages_(stages_for(weights.config())) {}

void Session::warn(Generation& g, Progress& progress, const std::string& message) {
  g.result.warnings.push_back(message);
  progress.warn(message);
}

Generation Session::start(const GenerateOptions& o, Progress& progress) {
  check(o.batch >= 1, "batch: expected 1 or more images denoised together, got ", o.batch);
  vit::check_threshold(o.safety.threshold, "safety threshold");
  Generation g;
  g.options = o;
  // Decoding with the tiny decoder and none of its own: the one the container holds (convert
  // --tiny-vae), read now. (Previews read it at the first one asked for.)
  if (g.options.tiny.decode) take_stored_tiny_decoder(g);
  check_tiny_decoder(g.options.tiny, weights_.config());
  weights_.reset_peak();
  cx_.clear_cancel();
  for (const auto& file : weights_.origin().files)
    g.model_files.emplace_back(file, FileStamp::of(file));
  stages_.start(*this, g, progress);
  // The inputs are checked once every option is: the classifier is the first network to run.
  if (o.safety.on() && !o.plan_only) check_safety_inputs(*this, g, progress);
  return g;
}

void Session::encode_prompt(Generation& g, Progress& progress, const TextLayerHook& on_layer) {
  stages_.encode_prompt(*this, g, progress, on_layer);
}

void Session::prepare_latents(Generation& g, Progress& progress) {
  stages_.prepare_latents(*this, g, progress);
}

void Session::denoise(Generation& g, Progress& progress, const StepHook& on_step) {
  stages_.denoise(*this, g, progress, with_tiny_preview(g, on_step));
}

bool Session::take_stored_tiny_decoder(Generation& g) {
  if (g.options.tiny.on()) return true;
  if (!stored_tiny_) stored_tiny_ = stored_tiny_decoder(weights_);
  g.options.tiny.model = *stored_tiny_;
  return g.options.tiny.on();
}

StepHook Session::with_tiny_preview(Generation& g, const StepHook& on_step) {
  const StoreOrigin origin = weights_.origin();
  const bool stored = origin.container_metadata && origin.container_metadata->contains("tiny_vae");
  if (!on_step || (!g.options.tiny.on() && !stored)) return on_step;
  return [this, &g, on_step](const StepView& step) {
    StepView view = step;
    view.preview = [this, &g, &step] {
      take_stored_tiny_decoder(g);
      return tiny_step_preview(stages_, weights_, cx_, g.options.tiny, step);
    };
    on_step(view);
  };
}

void Session::denoise(std::span<Generation* const> batch, Progress& progress,
                      const StepHook& on_first) {
  check(!batch.empty(), "denoise: an empty batch");
  for (size_t i = 0; i < batch.size(); ++i)
    check(batch[i]->options.batch == int64_t(batch.size()), "denoise: a batch of ", batch.size(),
          " images, but image ", i, " was started with options.batch = ",
          batch[i]->options.batch, " (its memory plan counts that many)");
  stages_.denoise_batch(*this, batch, progress, with_tiny_preview(*batch[0], on_first));
}

int64_t Session::batch_that_fits(const GenerateOptions& options, int64_t n) {
  GenerateOptions o = options;
  o.plan_only = true;
  Progress silent;
  for (int64_t b = n; b > 1; b = (b + 1) / 2) {
    o.batch = b;
    try {
      start(o, silent);
      return b;
    } catch (const Cancelled&) {
      throw;
    } catch (const Error&) {
      // too large together (or refused for another reason, which start() says for one)
    }
  }
  return 1;
}

void Session::decode(Generation& g, Progress& progress) {
  if (g.options.tiny.decode)
    decode_tiny(g, progress);
  else
    stages_.decode(*this, g, progress);
  if (g.options.safety.on()) check_safety_output(*this, g, progress);
  mark_image(g.options, g.result);
}

// The final latents through the tiny decoder; what the family's decode leaves, the same way.
void Session::decode_tiny(Generation& g, Progress& progress) {
  const Dumper dump(g.options.dump_dir);
  Tensor decoded;
  timed(g, progress, "tiny decode", 0, [&](Phase&) {
    const Compute::Use arithmetic(cx_, arithmetic_for(g.result.fast));
    const Tensor z = stages_.tiny_decoder_input(weights_, g.latents, g.grid, cx_);
    dump.f32("tiny_decoder_input", z, {1, z.dim(0), z.dim(1), z.dim(2)});
    // The full VAE's memory rule: whole planes below its limit, else bands.
    decoded = g.options.tiny.model->decode(
        z, cx_, {},
        taesd::TinyDecoder::band_rows_for(z.dim(1), z.dim(2), g.options.vae_memory.whole_limit,
                                          g.options.vae_memory.band_bytes));
    tiny_output_to_signed(decoded);
  });
  g.result.tiny_decoder = g.options.tiny.model->path().filename().string();
  finish_decode(*this, g, std::move(decoded));
}

void finish_decode(Session& s, Generation& g, Tensor decoded) {
  s.weights().release("vae.");
  g.latents = Tensor();
  g.result.weights = s.weights().residency_stats();
  Dumper(g.options.dump_dir).image(decoded);
  g.result.image = tensor_to_image(decoded);
  g.decoded = std::move(decoded);
  check_model_files_unchanged(g);
}

void mark_image(const GenerateOptions& o, GenerateResult& r) {
  r.watermarked = false;
  if (!o.watermark) {
    r.watermark_note = "turned off";
  } else if (!watermark_fits(r.image.width, r.image.height)) {
    r.watermark_note = "the image is smaller than the dwtDct method needs (" +
                       std::to_string(kWatermarkMinPixels) +
                       " pixels, e.g. 256x256, and 8 on each side): left unmarked";
  } else {
    embed_watermark(r.image, flux_watermark_bits());
    r.watermarked = true;
    r.watermark_note.clear();
  }
}

void settle_output_size(Session& s, Generation& g, Progress& progress, int64_t width,
                        int64_t height, int64_t multiple) {
  check(width >= 16 && height >= 16, "image size ", width, "x", height,
        " is too small (at least 16x16)");
  check(width <= 8192 && height <= 8192, "image size ", width, "x", height,
        " is too large (at most 8192 on a side)");
  if (width % multiple || height % multiple) {
    const int64_t w = floor_to_multiple(width, multiple), h = floor_to_multiple(height, multiple);
    s.warn(g, progress, "width and height must be multiples of " + std::to_string(multiple) +
                            ": producing " + std::to_string(w) + "x" + std::to_string(h) +
                            " instead of " + std::to_string(width) + "x" +
                            std::to_string(height));
    width = w;
    height = h;
  }
  g.result.width = width;
  g.result.height = height;
}

void check_model_files_unchanged(const Generation& g) {
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

void Session::generate_batch(std::span<const GenerateOptions> images, Progress& progress,
                             const BatchDone& done, const StepHook& on_first,
                             const BatchStarted& started) {
  check(!images.empty(), "generate_batch: no images");
  const size_t n = images.size();
  const size_t together = size_t(batch_that_fits(images[0], int64_t(n)));
  if (together < n)
    progress.warn("the " + std::to_string(n) + " images do not fit the memory budget denoised "
                  "together: " + std::to_string(together) + " at a time");
  struct Contexts {
    Tensor context, negative;
    bool from_cache = false;
  };
  std::map<std::pair<std::string, std::string>, Contexts> encoded;  // by prompt and negative
  for (size_t g0 = 0; g0 < n; g0 += together) {
    const size_t size = std::min(together, n - g0);
    std::vector<Generation> gens;
    gens.reserve(size);
    for (size_t j = 0; j < size; ++j) {
      GenerateOptions o = images[g0 + j];
      o.batch = int64_t(size);
      o.plan_only = false;
      gens.push_back(start(o, progress));
    }
    if (started) started(g0, size);
    std::vector<Generation*> batch;
    for (Generation& g : gens) {
      const auto key =
          std::pair(g.options.prompt, g.guided ? g.options.negative_prompt : std::string());
      if (const auto it = encoded.find(key); it != encoded.end()) {
        g.context = it->second.context.copy();
        g.negative = it->second.negative.copy();
        g.result.context_from_cache = it->second.from_cache;
      } else {
        encode_prompt(g, progress);
        encoded[key] = {g.context.copy(), g.negative.copy(), g.result.context_from_cache};
      }
    }
    for (Generation& g : gens) {
      prepare_latents(g, progress);
      batch.push_back(&g);
    }
    denoise(batch, progress, on_first);
    for (size_t j = 0; j < size; ++j) {
      decode(gens[j], progress);
      done(g0 + j, gens[j].result);
      gens[j].result.image = Image();  // handed over: the next decode does not hold it too
    }
  }
}

std::string parameters_text(const GenerateOptions& o, const GenerateResult& r,
                            const std::string& model_name) {
  std::ostringstream s;
  s << o.prompt << "\n";
  // Only what took effect: a distilled model (or guidance 1) runs no CFG, so its image owes
  // nothing to a guidance or a negative prompt that was given.
  if (r.guided && !o.negative_prompt.empty())
    s << "Negative prompt: " << o.negative_prompt << "\n";
  s << "Steps: " << r.steps << ", Sampler: Euler (flow matching), "
    << (r.embedded_guidance ? "Guidance: " : "CFG scale: ")
    << (r.guided || r.embedded_guidance ? r.guidance : 1.0f)
    << (r.seed ? ", Seed: " + std::to_string(*r.seed) : std::string(", Noise: from a file"))
    << ", Size: " << r.width << "x" << r.height
    << ", Model: " << model_name;
  if (r.guided && o.cfg_normalization) s << ", CFG normalization: " << *o.cfg_normalization;
  if (r.guided && o.cfg_truncation) s << ", CFG truncation: " << *o.cfg_truncation;
  if (!o.original_prompt.empty())
    s << ", Original prompt: " << nlohmann::json(o.original_prompt).dump();
  if (!o.references.empty()) s << ", References: " << o.references.size();
  if (r.strength) s << ", Denoising strength: " << *r.strength;
  if (!o.mask.empty()) s << ", Mask: " << o.mask.filename().string();
  if (!o.loras.empty()) {
    s << ", LoRA: ";
    for (size_t i = 0; i < o.loras.size(); ++i) s << (i ? " " : "") << lora_label(o.loras[i]);
  }
  if (!r.tiny_decoder.empty()) s << ", Decoder: tiny (" << r.tiny_decoder << ")";
  if (r.step_cache)
    s << ", Step cache: first-block " << r.step_cache->threshold << " (" << r.step_cache->computed
      << " computed, " << r.step_cache->skipped << " skipped)";
  if (r.safety) s << ", Safety: " << safety_text(*r.safety);
  s << ", Version: klein " << KLEIN_VERSION;
  return s.str();
}

nlohmann::ordered_json step_cache_json(const StepCacheResult& r) {
  nlohmann::ordered_json j;
  j["method"] = "first-block";
  j["threshold"] = r.threshold;
  j["computed"] = r.computed;
  j["skipped"] = r.skipped;
  return j;
}

std::string parameters_json(const GenerateOptions& o, const GenerateResult& r,
                            const std::string& model_name, const std::string& model_checksum) {
  nlohmann::ordered_json j;
  j["prompt"] = o.prompt;
  if (!o.original_prompt.empty()) j["original_prompt"] = o.original_prompt;
  j["negative_prompt"] = r.guided ? o.negative_prompt : std::string();
  j["steps"] = r.steps;
  j["sampler"] = "euler_flow_matching";
  j["guidance"] = r.guided || r.embedded_guidance ? r.guidance : r.no_guidance;
  if (r.guided && o.cfg_normalization) j["cfg_normalization"] = *o.cfg_normalization;
  if (r.guided && o.cfg_truncation) j["cfg_truncation"] = *o.cfg_truncation;
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
  if (!r.tiny_decoder.empty()) j["decoder"] = {{"name", "tiny"}, {"file", r.tiny_decoder}};
  if (r.step_cache) j["step_cache"] = step_cache_json(*r.step_cache);
  if (r.image.width) {  // a plan alone has no image to mark
    nlohmann::ordered_json w;
    w["embedded"] = r.watermarked;
    if (r.watermarked) {
      w["method"] = "invisible-watermark dwtDct";
      w["message"] = "FLUX (black-forest-labs/flux2)";
      w["bits"] = bits_text(flux_watermark_bits());
    } else {
      w["note"] = r.watermark_note;
    }
    j["watermark"] = w;
  }
  if (r.safety) j["safety"] = safety_json(*r.safety);
  j["program"] = std::string("klein ") + KLEIN_VERSION;
  return j.dump();
}

namespace {

// Text for an XML attribute or element.
std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\n': out += "&#10;"; break;
      case '\r': out += "&#13;"; break;
      case '\t': out += "&#9;"; break;
      default:
        // Other control characters are not allowed in XML 1.0 at all.
        if (static_cast<unsigned char>(c) >= 0x20) out += c;
    }
  }
  return out;
}

}  // namespace

std::string provenance_xmp(const std::string& metadata_json) {
  const nlohmann::json m = nlohmann::json::parse(metadata_json, nullptr, false);
  check(m.is_object(), "provenance: the image metadata is not a JSON object");
  auto text = [&](const char* key) {
    return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string();
  };
  // IPTC's digital source types: made by a trained model, or a given image changed by one.
  const bool edit = (m.contains("references") && m["references"].is_array() &&
                     !m["references"].empty()) || m.contains("init_image");
  const std::string source = std::string("http://cv.iptc.org/newscodes/digitalsourcetype/") +
                             (edit ? "compositeWithTrainedAlgorithmicMedia"
                                   : "trainedAlgorithmicMedia");
  std::string prompt = text("prompt");
  if (!text("negative_prompt").empty()) prompt += "\nNegative prompt: " + text("negative_prompt");
  std::string x;
  x += "<?xpacket begin=\"\xEF\xBB\xBF\" id=\"W5M0MpCehiHzreSzNTczkc9d\"?>\n";
  x += "<x:xmpmeta xmlns:x=\"adobe:ns:meta/\">\n";
  x += " <rdf:RDF xmlns:rdf=\"http://www.w3.org/1999/02/22-rdf-syntax-ns#\">\n";
  x += "  <rdf:Description rdf:about=\"\"\n";
  x += "    xmlns:Iptc4xmpExt=\"http://iptc.org/std/Iptc4xmpExt/2008-02-29/\"\n";
  x += "    xmlns:xmp=\"http://ns.adobe.com/xap/1.0/\"\n";
  x += "    Iptc4xmpExt:DigitalSourceType=\"" + source + "\"\n";
  x += "    Iptc4xmpExt:AISystemUsed=\"" + xml_escape(text("model")) + "\"\n";
  x += "    Iptc4xmpExt:AIPromptInformation=\"" + xml_escape(prompt) + "\"\n";
  x += "    xmp:CreatorTool=\"" + xml_escape(text("program")) + "\"/>\n";
  x += " </rdf:RDF>\n";
  x += "</x:xmpmeta>\n";
  x += "<?xpacket end=\"r\"?>";
  return x;
}

}  // namespace klein
