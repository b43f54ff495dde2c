// `klein generate --batch N` and `--prompts FILE` on the tiny model: image i of a batch is,
// pixel for pixel, the image that prompt makes alone with seed s+i; bad batches are refused
// before anything is written; the text encoder runs once per distinct prompt.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "formats/image/image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

std::string tiny_args(int64_t seed) {
  return "generate -m " + testing::shell_arg(testing::tiny_model()) + " -W 64 -H 64 --seed " +
         std::to_string(seed) + " --no-cache --threads 2 -q";
}

// The image `klein generate` makes alone with this prompt and seed.
Image alone(const fs::path& dir, const std::string& prompt, int64_t seed) {
  const fs::path out = dir / ("alone-" + std::to_string(seed) + ".png");
  std::string log;
  EXPECT_EQ(testing::run_klein(tiny_args(seed) + " -p " + testing::shell_arg(prompt) + " -o " +
                                   testing::shell_arg(out), &log), 0) << log;
  return load_image(out);
}

void expect_same_pixels(const Image& got, const Image& want, const std::string& what) {
  ASSERT_EQ(got.width, want.width) << what;
  ASSERT_EQ(got.height, want.height) << what;
  EXPECT_TRUE(got.rgb == want.rgb) << what << ": the pixels differ from the image made alone";
}

TEST(Batch, PromptsFileImagesAreTheImagesMadeAlone) {
  const fs::path dir = testing::temp_dir("batch-prompts");
  // Blank lines (and a Windows line end) are skipped: three images, seeds 41, 42, 43.
  const std::vector<std::string> prompts = {"a red cat", "a blue house by the sea", "a red cat"};
  {
    std::ofstream f(dir / "prompts.txt", std::ios::binary);
    f << prompts[0] << "\n\n   \n" << prompts[1] << "\r\n" << prompts[2] << "\n\n";
  }
  std::string log;
  ASSERT_EQ(testing::run_klein(tiny_args(41) + " --prompts " +
                                   testing::shell_arg(dir / "prompts.txt") + " -o " +
                                   testing::shell_arg(dir / "out.png") + " --json", &log), 0) << log;
  // Two distinct prompts: the text encoder runs twice (the prompt cache is off).
  int encodes = 0;
  for (size_t at = 0; (at = log.find(R"("event":"begin","phase":"text encoder")", at)) != std::string::npos; ++at)
    ++encodes;
  EXPECT_EQ(encodes, 2) << log;
  EXPECT_FALSE(fs::exists(dir / "out.png"));
  EXPECT_FALSE(fs::exists(dir / "out-3.png"));
  std::vector<Image> batch;
  for (int i = 0; i < 3; ++i) batch.push_back(load_image(dir / ("out-" + std::to_string(i) + ".png")));
  for (int i = 0; i < 3; ++i)
    expect_same_pixels(batch[size_t(i)], alone(dir, prompts[size_t(i)], 41 + i),
                       "image " + std::to_string(i));
  // Same prompt, seeds 41 and 43: the seed advances, so the two differ.
  EXPECT_FALSE(batch[0].rgb == batch[2].rgb);
}

TEST(Batch, BatchImagesAreTheImagesMadeAloneWithTheNextSeeds) {
  const fs::path dir = testing::temp_dir("batch-n");
  std::string log;
  ASSERT_EQ(testing::run_klein(tiny_args(7) + " -p 'a small boat' --batch 2 -o " +
                                   testing::shell_arg(dir / "b.png"), &log), 0) << log;
  const Image first = load_image(dir / "b-0.png"), second = load_image(dir / "b-1.png");
  expect_same_pixels(first, alone(dir, "a small boat", 7), "image 0");
  expect_same_pixels(second, alone(dir, "a small boat", 8), "image 1");
  EXPECT_FALSE(first.rgb == second.rgb);
  EXPECT_FALSE(fs::exists(dir / "b-2.png"));
}

TEST(Batch, BadBatchesAreRefusedBeforeAnyImage) {
  const fs::path dir = testing::temp_dir("batch-refused");
  { std::ofstream(dir / "empty.txt") << "\n   \n\n"; }
  { std::ofstream(dir / "two.txt") << "one\ntwo\n"; }
  { std::ofstream(dir / "huge.txt") << std::string((size_t(16) << 20) + 1, 'a'); }
  const std::string out = " -o " + testing::shell_arg(dir / "x.png");
  const std::string two = " --prompts " + testing::shell_arg(dir / "two.txt");
  const struct {
    std::string args, message;
  } cases[] = {
      {" -p cat --batch 0", "--batch"},
      {" -p cat --batch 1001", "--batch"},
      {" --prompts " + testing::shell_arg(dir / "empty.txt"), "no prompt in the file"},
      {" -p cat" + two, "-p/--prompt and --prompts"},
      {" --batch 2" + two, "--batch and --prompts"},
      {"", "-p/--prompt or --prompts"},
      {" -p cat --batch 2 --noise " + testing::shell_arg(dir / "two.txt"), "--batch with --noise"},
      {" --prompts " + testing::shell_arg(dir / "huge.txt"), "a prompts file holds at most"},
  };
  for (const auto& c : cases) {
    std::string log;
    EXPECT_NE(testing::run_klein(tiny_args(1) + c.args + out, &log), 0) << c.args;
    EXPECT_NE(log.find(c.message), std::string::npos) << c.args << "\n" << log;
  }
  for (const char* name : {"x.png", "x-0.png", "x-1.png"}) EXPECT_FALSE(fs::exists(dir / name));
}

}  // namespace
}  // namespace klein
