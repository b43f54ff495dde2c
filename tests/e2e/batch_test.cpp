// `klein generate --batch N` and `--prompts FILE` on the tiny model: image i of a batch is,
// pixel for pixel, the image that prompt makes alone with seed s+i; bad batches are refused
// before anything is written; the text encoder runs once per distinct prompt.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
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

// The need of a batch without read-ahead, from its --dry-run plan.
uint64_t one_unit_need(const std::string& args) {
  std::string log;
  EXPECT_EQ(testing::run_klein(args + " --dry-run --json", &log), 0) << log;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(R"("event":"memory")") == std::string::npos) continue;
    return nlohmann::json::parse(line)["need_one_unit_bytes"].get<uint64_t>();
  }
  ADD_FAILURE() << "no memory event in: " << log;
  return 0;
}

TEST(Batch, ABatchTheBudgetDoesNotHoldGoesInGroupsOfTheSameImages) {
  const fs::path dir = testing::temp_dir("batch-groups");
  const std::string args = "generate -m " + testing::shell_arg(testing::tiny_model()) +
                           " -W 32 -H 32 -s 2 --seed 20 --no-cache --threads 2 -p 'a kite'";
  // The tiny model's VAE decode is its largest phase, unless the batch is large: 16 images
  // need more than it, 8 do not. A budget between one image's need (without read-ahead) and
  // sixteen's makes groups of 8.
  const uint64_t one = one_unit_need(args), sixteen = one_unit_need(args + " --batch 16");
  ASSERT_GT(sixteen, one);
  EXPECT_EQ(one_unit_need(args + " --batch 8"), one);
  const uint64_t budget = one + (sixteen - one) / 2;
  std::string log;
  ASSERT_EQ(testing::run_klein(args + " --batch 16 --max-memory " + std::to_string(budget) +
                                   " -o " + testing::shell_arg(dir / "k.png"), &log), 0) << log;
  EXPECT_NE(log.find("the 16 images do not fit the memory budget denoised together: 8 at a "
                     "time"), std::string::npos) << log;
  for (int i : {0, 8, 15}) {  // the first of each group, and the last image
    std::string alone_log;
    const fs::path alone = dir / ("alone-" + std::to_string(i) + ".png");
    ASSERT_EQ(testing::run_klein("generate -m " + testing::shell_arg(testing::tiny_model()) +
                                     " -W 32 -H 32 -s 2 --no-cache --threads 2 -q -p 'a kite'"
                                     " --seed " + std::to_string(20 + i) + " -o " +
                                     testing::shell_arg(alone), &alone_log), 0) << alone_log;
    expect_same_pixels(load_image(dir / ("k-" + std::to_string(i) + ".png")), load_image(alone),
                       "image " + std::to_string(i));
  }
  EXPECT_TRUE(fs::exists(dir / "k-15.png"));
  EXPECT_FALSE(fs::exists(dir / "k-16.png"));
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
