// klein safety IMAGE...: the image safety check of BFL's FLUX.2 reference. Each image goes
// through the classifier it uses (Falconsai/nsfw_image_detection, a ViT; models/vit) and is
// flagged when its "nsfw" probability is strictly above the threshold (BFL's 0.85).
// Exit status: 0 nothing flagged, 2 at least one image flagged, 1 an error (model, image,
// option).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "formats/image/image.h"
#include "models/vit/safety.h"
#include "ops/compute.h"
#include "weights/safety_model.h"

namespace klein::cli {
namespace {

namespace fs = std::filesystem;

struct SafetyArgs {
  std::string model;
  std::vector<std::string> images;
  double threshold = vit::kNsfwThreshold;
  bool json = false;
  int threads = 0;
};

void run_safety(const SafetyArgs& a) {
  vit::check_threshold(a.threshold, "--threshold");
  std::string model = a.model;
  if (model.empty())
    if (const char* env = std::getenv("KLEIN_SAFETY_MODEL")) model = env;
  check(!model.empty(),
        "safety: no classifier given: --model DIR (the Hugging Face directory "
        "of Falconsai/nsfw_image_detection) or KLEIN_SAFETY_MODEL");
  // Every image there before the model is read.
  for (const std::string& image : a.images) {
    check(fs::exists(image), "safety: image ", image, " does not exist");
    check(fs::is_regular_file(image), "safety: ", image, " is not a file");
  }
  const SafetyModel classifier = open_safety_model(model);
  Compute cx(a.threads);
  bool any_flagged = false;
  for (const std::string& file : a.images) {
    const vit::Classification scores = vit::classify_image(classifier, load_image(file), cx);
    const vit::SafetyVerdict v = vit::judge(scores, classifier.config, a.threshold);
    any_flagged = any_flagged || v.flagged;
    if (a.json) {
      nlohmann::ordered_json j;
      j["file"] = file;
      j["label"] = v.label;
      j["nsfw"] = v.nsfw;
      j["flagged"] = v.flagged;
      j["threshold"] = v.threshold;
      nlohmann::ordered_json all;
      for (size_t i = 0; i < scores.probs.size(); ++i)
        all[classifier.config.labels[i]] = scores.probs[i];
      j["scores"] = all;
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s: %s, nsfw %.6f, %s (threshold %g)\n", file.c_str(), v.label.c_str(),
                  double(v.nsfw), v.flagged ? "FLAGGED" : "not flagged", v.threshold);
    }
  }
  std::fflush(stdout);
  if (any_flagged) throw CLI::RuntimeError(kExitFlagged);
}

}  // namespace

static Registration safety_command("safety", 36, [](CLI::App& app) {
  auto a = std::make_shared<SafetyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "safety",
      "Classify images with FLUX.2's safety classifier (exit 0: none flagged, 2: some image's "
      "nsfw probability is above the threshold, 1: error)");
  cmd->add_option("-m,--model", a->model,
                  "The classifier's Hugging Face directory (config.json, model.safetensors, "
                  "preprocessor_config.json of Falconsai/nsfw_image_detection); default "
                  "$KLEIN_SAFETY_MODEL");
  cmd->add_option("images", a->images, "Images to check (PNG, JPEG or WebP)")->required();
  cmd->add_option("--threshold", a->threshold,
                  "Flag an image when its nsfw probability is strictly above this, in [0, 1]")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "One JSON object per image, one per line");
  cmd->add_option("-t,--threads", a->threads, "Threads (default: one per usable CPU)");
  cmd->callback([a] { run_safety(*a); });
});

}  // namespace klein::cli
