// klein control canny: a control image made from a picture, for Z-Image's ControlNet
// (--control-image): Canny edges as OpenCV computes them (formats/image/canny.h), white on
// black, the picture's size.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "formats/image/canny.h"
#include "formats/image/image.h"

namespace klein::cli {
namespace {

namespace fs = std::filesystem;

struct CannyArgs {
  fs::path input, output;
  double low = 100, high = 200;
};

void run_canny(const CannyArgs& a) {
  check(is_image_name(a.output), "-o ", a.output.string(),
        ": expected a .png, .jpg or .webp file name");
  check(std::isfinite(a.low) && std::isfinite(a.high) && a.low >= 0 && a.high >= 0,
        "--low and --high: expected thresholds of 0 or more, got ", a.low, " and ", a.high);
  const Image edges = canny_edges(load_image(a.input), a.low, a.high);
  save_image(a.output, edges);
  std::printf("%s\n", a.output.c_str());
}

}  // namespace

static Registration control_command("control", 27, [](CLI::App& app) {
  CLI::App* control = app.add_subcommand(
      "control", "Make a control image for Z-Image's ControlNet (generate --control-image)");
  control->require_subcommand(1);
  auto a = std::make_shared<CannyArgs>();
  CLI::App* canny = control->add_subcommand(
      "canny",
      "Canny edges of a picture (OpenCV's: Sobel 3x3, L1 gradient, thinning, hysteresis), white "
      "on black");
  canny->add_option("image", a->input, "The picture (PNG, JPEG or WebP)")
      ->required()
      ->check(CLI::ExistingFile);
  canny->add_option("-o,--output", a->output, "The edge image (.png, .jpg or .webp)")->required();
  canny->add_option("--low", a->low, "Edges continue above this gradient (L1 of Sobel 3x3)")
      ->capture_default_str();
  canny->add_option("--high", a->high, "Edges start above this gradient")->capture_default_str();
  canny->callback([a] { run_canny(*a); });
});

}  // namespace klein::cli
