#pragma once
// Comparing what `klein generate --dump` wrote with an official pipeline's golden files.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace klein::testing {

// The generate arguments of the end-to-end comparisons where the weights change but the run
// does not (FP8, GGUF and LoRA sources against their reference weights): a fixed prompt, 4
// steps at 64x64, seed 7, no cache, 2 threads, quiet.
inline constexpr const char* kComparedRun =
    " -p \"a red cube on a table\" -s 4 -W 64 -H 64 --seed 7 --no-cache --threads 2 -q";
// The same as a string, to append to.
inline const std::string kRun = kComparedRun;

// `klein generate MODEL_ARGS <kComparedRun> --dump DIR/NAME -o DIR/NAME.png`: success, or a
// failure that shows the command's output.
::testing::AssertionResult generate_compared_run(const std::string& model_args,
                                                 const std::filesystem::path& dir,
                                                 const std::string& name);

// The tiny model's components (linked) under a model_index.json in which `from` is replaced by
// `to` (a test failure when `from` is not there): the same weights declared as another
// checkpoint, e.g. a K/V or a base model. A fresh directory named `name`.
std::filesystem::path tiny_model_declared_as(const std::string& name, const std::string& from,
                                             const std::string& to);

// <testdata>/<set>/vectors/<kind>: a golden set next to klein-tiny (say klein-tiny-edit,
// inpaint).
std::filesystem::path golden_vectors(const std::string& set, const std::string& kind);

// Every named .npy under dump/ against ref/ within 1e-4 scaled difference, the per-step files
// of `steps` steps (timestep, latents in, velocity, latents out) included, and no step file
// beyond them; img_ids exactly.
void expect_dump_matches(const std::filesystem::path& dump, const std::filesystem::path& ref,
                         std::vector<std::string> files, int steps);

// The PNG at `got` within one grey level of `want` on every channel, both width x height.
void expect_png_matches(const std::filesystem::path& got, const std::filesystem::path& want,
                        int width, int height);

// `klein <args> -o <out>` fails, says `expected`, writes no `out`, and stops before the text
// encoder runs (its progress line would name it): a refusal before any work.
void expect_refused_before_work(const std::string& args, const std::string& expected,
                                const std::filesystem::path& out);

}  // namespace klein::testing
