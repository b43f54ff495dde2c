#include "pipeline/safety.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "formats/image/blur.h"
#include "formats/image/preprocess.h"
#include "pipeline/pipeline.h"
#include "pipeline/stages.h"

namespace klein {

namespace fs = std::filesystem;

const char* safety_action_name(SafetyAction action) {
  return action == SafetyAction::Blur ? "blur" : "refuse";
}

SafetyAction parse_safety_action(const std::string& text, const std::string& option) {
  if (text == "refuse") return SafetyAction::Refuse;
  if (text == "blur") return SafetyAction::Blur;
  fail(option, ": expected refuse (no image, an error) or blur (a blurred image), got \"", text,
       "\"");
}

std::shared_ptr<const SafetyModel> open_shared_safety_model(const fs::path& dir,
                                                            const std::string& option) {
  check(!dir.empty(), option, ": no safety classifier directory given");
  check(fs::is_directory(dir) || container_has_safety_model(dir), option, " ", dir.string(),
        ": not a directory (the Hugging Face "
        "directory of Falconsai/nsfw_image_detection: config.json, model.safetensors, "
        "preprocessor_config.json) nor a klein container holding a classifier");
  return std::make_shared<const SafetyModel>(open_safety_model(dir));
}

namespace {

std::string probability(double p) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4f", p);
  return text;
}

// The verdict on one 8-bit image.
SafetyCheck classify(Session& session, const SafetyOptions& o, const Image& rgb, std::string name) {
  Compute& cx = session.compute();
  const Compute::Use exact(cx, Arithmetic::exact());
  const vit::SafetyVerdict v =
      vit::judge(vit::classify_image(*o.model, rgb, cx), o.model->config, o.threshold);
  return {std::move(name), v.nsfw, v.flagged};
}

SafetyReport& report_of(Generation& g) {
  if (!g.result.safety) {
    g.result.safety.emplace();
    g.result.safety->threshold = g.options.safety.threshold;
    g.result.safety->action = g.options.safety.action;
  }
  return *g.result.safety;
}

}  // namespace

void check_safety_inputs(Session& session, Generation& g, Progress& progress) {
  const GenerateOptions& o = g.options;
  std::vector<fs::path> inputs = o.references;
  if (!o.init_image.empty()) inputs.push_back(o.init_image);
  SafetyReport& report = report_of(g);
  if (inputs.empty()) return;
  session.timed(g, progress, "safety check inputs", int(inputs.size()), [&](Phase& phase) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const fs::path& file = inputs[i];
      SafetyCheck c = classify(session, o.safety, load_image(file), file.filename().string());
      report.inputs.push_back(c);
      phase.step(int(i + 1), int(inputs.size()));
      if (c.flagged)
        throw SafetyFlagged("safety check: the input image " + file.string() +
                                " has an nsfw probability of " + probability(c.nsfw) +
                                ", above the threshold " + probability(o.safety.threshold) +
                                ": nothing was generated",
                            c, o.safety.threshold);
    }
  });
}

void check_safety_output(Session& session, Generation& g, Progress& progress) {
  const GenerateOptions& o = g.options;
  SafetyReport& report = report_of(g);
  session.timed(g, progress, "safety check image", 0, [&](Phase&) {
    // BFL classifies the decoded tensor converted to 8 bits by truncation, not the rounded
    // pixels that are written.
    const Image rgb = g.decoded.numel() > 0 ? tensor_to_image_truncated(g.decoded) : g.result.image;
    report.output = classify(session, o.safety, rgb, "output");
  });
  const SafetyCheck& c = *report.output;
  if (!c.flagged) return;
  if (o.safety.action == SafetyAction::Refuse)
    throw SafetyFlagged("safety check: the generated image has an nsfw probability of " +
                            probability(c.nsfw) + ", above the threshold " +
                            probability(o.safety.threshold) +
                            ": no image is given (the blur action gives a blurred one)",
                        c, o.safety.threshold);
  Image& image = g.result.image;
  box_blur(image, strong_blur_radius(image.width, image.height));
  report.blurred = true;
  session.warn(g, progress,
               "safety check: the generated image has an nsfw probability of " +
                   probability(c.nsfw) + ", above the threshold " +
                   probability(o.safety.threshold) + ": it is blurred");
}

nlohmann::ordered_json safety_json(const SafetyReport& r) {
  auto one = [](const SafetyCheck& c) {
    nlohmann::ordered_json j;
    j["image"] = c.image;
    j["nsfw"] = c.nsfw;
    j["flagged"] = c.flagged;
    return j;
  };
  nlohmann::ordered_json j;
  j["classifier"] = "Falconsai/nsfw_image_detection (ViT)";
  j["threshold"] = r.threshold;
  j["action"] = safety_action_name(r.action);
  j["inputs"] = nlohmann::ordered_json::array();
  for (const SafetyCheck& c : r.inputs) j["inputs"].push_back(one(c));
  if (r.output) {
    j["nsfw"] = r.output->nsfw;
    j["flagged"] = r.output->flagged;
  }
  j["blurred"] = r.blurred;
  if (r.blurred)
    j["note"] = "the generated image's nsfw probability " + probability(r.output->nsfw) +
                " is above the threshold " + probability(r.threshold) +
                ": the image is blurred (safety action blur)";
  return j;
}

std::string safety_text(const SafetyReport& r) {
  if (!r.output) return "inputs checked (threshold " + probability(r.threshold) + ")";
  const SafetyCheck& c = *r.output;
  if (!c.flagged)
    return "nsfw " + probability(c.nsfw) + " (threshold " + probability(r.threshold) + ")";
  return "flagged, nsfw " + probability(c.nsfw) + " > " + probability(r.threshold) +
         (r.blurred ? ", blurred" : "");
}

}  // namespace klein
