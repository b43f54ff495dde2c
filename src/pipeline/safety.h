#pragma once
// The image safety check of BFL's FLUX.2 reference around a generation (scripts/cli.py): the
// classifier (Falconsai/nsfw_image_detection, models/vit) looks at every input image before
// any work (the references and the init image: Session::start, after the options are
// checked) and at the generated image after decoding (Session::decode, before the invisible
// mark), the decoded tensor converted to 8 bits as BFL does it (tensor_to_image_truncated).
// An image is flagged when its "nsfw" probability is strictly above the threshold (BFL's
// 0.85). A flagged input always stops the generation (SafetyFlagged); a flagged output
// stops it too (no image is given), or, with SafetyAction::Blur, is handed out strongly
// blurred (formats/image/blur.h), the metadata saying why. The verdicts go into the result
// (GenerateResult::safety) and from there into the image's metadata.
//
// Every front end (CLI, server, C library, Python) gets the check through GenerateOptions;
// the classifier is opened once by the front end and shared by its generations.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"
#include "models/vit/safety.h"
#include "weights/safety_model.h"

namespace klein {

// What happens to a generated image that is flagged.
enum class SafetyAction {
  Refuse,  // no image: SafetyFlagged (BFL's behaviour)
  Blur,    // the image strongly blurred, with the verdict in its metadata
};
const char* safety_action_name(SafetyAction action);  // "refuse", "blur"
// "refuse" or "blur"; anything else throws naming `option`.
SafetyAction parse_safety_action(const std::string& text, const std::string& option);

struct SafetyOptions {
  std::shared_ptr<const SafetyModel> model;  // null: no checks
  double threshold = vit::kNsfwThreshold;    // flagged when nsfw > threshold; in [0, 1]
  SafetyAction action = SafetyAction::Refuse;

  bool on() const { return model != nullptr; }
};

// Opens the classifier's Hugging Face directory for SafetyOptions::model (every file checked
// before any image is read; errors name the file). `option` names where the path came from.
std::shared_ptr<const SafetyModel> open_shared_safety_model(const std::filesystem::path& dir,
                                                            const std::string& option);

// One image's verdict.
struct SafetyCheck {
  std::string image;  // "output", or the input file's name
  float nsfw = 0;     // the "nsfw" probability
  bool flagged = false;
};

// What the checks of one generation found.
struct SafetyReport {
  double threshold = vit::kNsfwThreshold;
  SafetyAction action = SafetyAction::Refuse;
  std::vector<SafetyCheck> inputs;    // references, then the init image
  std::optional<SafetyCheck> output;  // the generated image
  bool blurred = false;               // the output was flagged and is blurred (action Blur)
};

// A flagged image stopped the generation: nothing is given. The front ends answer it apart
// from other errors (the CLI's exit status 2, the server's 422, KLEIN_ERROR_FLAGGED).
class SafetyFlagged : public Error {
 public:
  SafetyFlagged(const std::string& message, SafetyCheck check, double threshold)
      : Error(message), check(std::move(check)), threshold(threshold) {}
  SafetyCheck check;
  double threshold;
};

class Session;
struct Generation;
class Progress;

// The stages' checks (Session::start and Session::decode call them when
// options.safety.on()): every input image, each loaded as the classifier's pipeline loads a
// file (EXIF orientation applied), throwing SafetyFlagged at the first one flagged; then the
// generated image (g.decoded), throwing SafetyFlagged when it is flagged and the action is
// Refuse, blurring g.result.image when it is Blur. Each records its verdicts in
// g.result.safety.
void check_safety_inputs(Session& session, Generation& g, Progress& progress);
void check_safety_output(Session& session, Generation& g, Progress& progress);

// The report as the metadata JSON's "safety" object: {"classifier", "threshold", "action",
// "inputs": [{"image", "nsfw", "flagged"}], "nsfw" and "flagged" (the generated image's),
// "blurred", "note" (when blurred)}.
nlohmann::ordered_json safety_json(const SafetyReport& report);
// The report for the A1111-style parameters text: "nsfw 0.1234 (threshold 0.85)", or
// "flagged, nsfw 0.9123 > 0.85, blurred".
std::string safety_text(const SafetyReport& report);

}  // namespace klein
