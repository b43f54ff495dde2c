#include "e2e/golden_dump.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "core/files.h"
#include "core/npy.h"
#include "formats/image/image.h"
#include "support/testing.h"

namespace klein::testing {

namespace fs = std::filesystem;

fs::path tiny_model_declared_as(const std::string& name, const std::string& from,
                                const std::string& to) {
  const fs::path dir = temp_dir(name);
  for (const auto& entry : fs::directory_iterator(tiny_model())) {
    const fs::path link = dir / entry.path().filename();
    if (entry.path().filename() != "model_index.json" && !fs::exists(fs::symlink_status(link)))
      fs::create_directory_symlink(entry.path(), link);
  }
  std::string index = read_text_file(tiny_model() / "model_index.json");
  const size_t at = index.find(from);
  EXPECT_NE(at, std::string::npos) << from << " is not in the tiny model's model_index.json";
  if (at != std::string::npos) index.replace(at, from.size(), to);
  write_text(dir / "model_index.json", index);
  return dir;
}

fs::path golden_vectors(const std::string& set, const std::string& kind) {
  return tiny_dir().parent_path() / set / "vectors" / kind;
}

void expect_dump_matches(const fs::path& dump, const fs::path& ref, std::vector<std::string> files,
                         int steps) {
  for (int i = 0; i < steps; ++i)
    for (const char* part : {"timestep", "latents_in", "velocity", "latents_out"})
      files.push_back("step" + std::to_string(i) + "_" + part);
  for (const auto& f : files) {
    const std::vector<float> g = read_npy(dump / (f + ".npy")).to_f32();
    EXPECT_TRUE(matches_npy(g.data(), int64_t(g.size()), ref / (f + ".npy"), 1e-4)) << f;
  }
  EXPECT_FALSE(fs::exists(dump / ("step" + std::to_string(steps) + "_velocity.npy")));
  EXPECT_EQ(read_npy(dump / "img_ids.npy").to_i64(), read_npy(ref / "img_ids.npy").to_i64());
}

void expect_png_matches(const fs::path& got_path, const fs::path& want_path, int width,
                        int height) {
  const Image got = load_image(got_path);
  const Image want = load_image(want_path);
  ASSERT_EQ(got.width, width);
  ASSERT_EQ(got.height, height);
  ASSERT_EQ(want.width, width);
  ASSERT_EQ(want.height, height);
  int worst = 0;
  for (size_t i = 0; i < got.rgb.size(); ++i)
    worst = std::max(worst, std::abs(got.rgb[i] - want.rgb[i]));
  EXPECT_LE(worst, 1);
}

::testing::AssertionResult generate_compared_run(const std::string& model_args,
                                                 const std::filesystem::path& dir,
                                                 const std::string& name) {
  const std::string command = "generate" + model_args + kComparedRun + " --dump " +
                              shell_arg(dir / name) + " -o " + shell_arg(dir / (name + ".png"));
  std::string log;
  const int rc = run_klein(command, &log);
  if (rc == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "klein " << command << " exited with " << rc << ":\n"
                                       << log;
}

void expect_refused_before_work(const std::string& args, const std::string& expected,
                                const std::filesystem::path& out) {
  std::string log;
  EXPECT_NE(run_klein(args + " -o " + shell_arg(out), &log), 0) << args;
  EXPECT_NE(log.find(expected), std::string::npos) << args << ": " << log;
  EXPECT_EQ(log.find("text encoder"), std::string::npos) << "work started: " << args << log;
  EXPECT_FALSE(std::filesystem::exists(out)) << args;
}

}  // namespace klein::testing
