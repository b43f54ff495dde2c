// klein watermark: reads the invisible mark of an image (--check), or marks one (--embed).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "formats/image/image.h"
#include "formats/image/watermark.h"

namespace klein::cli {
namespace {

// The exit status of --check when the file is read but does not carry FLUX's message.
constexpr int kNoMark = 2;

struct WatermarkArgs {
  std::string check, embed, output;
  bool json = false;
  int jpeg_quality = 95;
};

void run_check(const WatermarkArgs& a) {
  const Image image = load_image(a.check);
  const std::span<const uint8_t> flux = flux_watermark_bits();
  const WatermarkReading r = read_watermark(image, flux.size());
  const bool match = std::equal(r.bits.begin(), r.bits.end(), flux.begin(), flux.end());
  // How many blocks read the bit FLUX's message has there: about half on an unmarked image.
  int64_t agreeing = 0;
  for (size_t k = 0; k < flux.size(); ++k)
    agreeing += flux[k] ? r.ones[k] : r.votes[k] - r.ones[k];
  const double agreement = r.blocks ? double(agreeing) / double(r.blocks) : 0.0;
  if (a.json) {
    nlohmann::ordered_json j;
    j["file"] = a.check;
    j["width"] = image.width;
    j["height"] = image.height;
    j["method"] = "dwtDct";
    j["bits"] = bits_text(r.bits);
    j["flux_bits"] = bits_text(flux);
    j["flux_mark"] = match;
    j["blocks"] = r.blocks;
    j["block_agreement"] = agreement;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s: %s\n", a.check.c_str(), bits_text(r.bits).c_str());
    std::printf("%s: FLUX's mark (%s), %.1f %% of %lld blocks agree\n",
                match ? "found" : "not found", bits_text(flux).c_str(), 100 * agreement,
                static_cast<long long>(r.blocks));
  }
  if (!match) throw CLI::RuntimeError(kNoMark);
}

void run_embed(const WatermarkArgs& a) {
  check(!a.output.empty(), "watermark --embed needs -o/--output FILE");
  Image image = load_image(a.embed);
  const WatermarkStats s = embed_watermark(image, flux_watermark_bits());
  save_image(a.output, image, {}, a.jpeg_quality);
  std::fprintf(stderr, "%lld blocks, %lld embedded again to read back, %lld unreadable\n",
               static_cast<long long>(s.blocks), static_cast<long long>(s.corrected),
               static_cast<long long>(s.unreadable));
  std::printf("%s\n", a.output.c_str());
}

}  // namespace

static Registration watermark_command("watermark", 35, [](CLI::App& app) {
  auto a = std::make_shared<WatermarkArgs>();
  CLI::App* cmd = app.add_subcommand(
      "watermark",
      "Read the invisible dwtDct mark of an image (exit 0: FLUX's mark found, 2: not found), "
      "or mark an image");
  auto* check_opt = cmd->add_option("--check", a->check, "Image to read (PNG, JPEG or WebP)");
  auto* embed_opt = cmd->add_option("--embed", a->embed, "Image to mark (written to --output)");
  check_opt->excludes(embed_opt);
  cmd->add_option("-o,--output", a->output, "With --embed: the marked image (.png, .jpg, .webp)");
  cmd->add_option("--jpeg-quality", a->jpeg_quality, "With --embed to a JPEG: quality 1-100")
      ->check(CLI::Range(1, 100));
  cmd->add_flag("--json", a->json, "With --check: the result as one JSON line");
  cmd->callback([a] {
    if (!a->check.empty()) return run_check(*a);
    if (!a->embed.empty()) return run_embed(*a);
    fail("watermark: give --check FILE or --embed FILE -o OUTPUT");
  });
});

}  // namespace klein::cli
