#pragma once
// The step that the front ends' tests (C API, server, Python's C side, single files, GGUF)
// share: `klein generate` with the same parameters, and the image it wrote, to compare pixels
// with what the front end made. Header-only: the programs that include it link the image
// library already.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "formats/image/image.h"
#include "support/testing.h"

namespace klein::testing {

// `klein generate -m MODEL -p PROMPT OPTIONS --no-cache -q -o FILE` and the image it wrote; a
// test failure with the CLI's output, and an empty image, where it exits non-zero.
inline Image cli_generate(const std::filesystem::path& model, const std::string& prompt,
                          const std::string& options, const std::filesystem::path& file) {
  std::string log;
  const int rc = run_klein("generate -m " + shell_arg(model) + " -p " + shell_arg(prompt) + " " +
                               options + " --no-cache -q -o " + shell_arg(file),
                           &log);
  EXPECT_EQ(rc, 0) << log;
  return rc == 0 ? load_image(file) : Image();
}

// Whether `pixels` (width x height RGB, as the C API returns them) are the CLI image's.
inline ::testing::AssertionResult same_pixels(const Image& cli, const uint8_t* pixels, int width,
                                              int height) {
  if (cli.width != width || cli.height != height)
    return ::testing::AssertionFailure() << "the CLI made " << cli.width << "x" << cli.height
                                         << ", the front end " << width << "x" << height;
  if (std::memcmp(cli.rgb.data(), pixels, cli.rgb.size()) != 0)
    return ::testing::AssertionFailure() << "same size, other pixels";
  return ::testing::AssertionSuccess();
}

// The largest difference of two images, in 8-bit levels (256: the sizes differ).
inline int max_level_diff(const Image& a, const Image& b) {
  if (a.width != b.width || a.height != b.height) return 256;
  int worst = 0;
  for (size_t i = 0; i < a.rgb.size(); ++i)
    worst = std::max(worst, std::abs(int(a.rgb[i]) - int(b.rgb[i])));
  return worst;
}

}  // namespace klein::testing
