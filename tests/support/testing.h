#pragma once
// Helpers shared by the test programs: paths to the golden data and tensor comparison.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/npy.h"
#include "core/tensor.h"

namespace klein::testing {

// ../shared/testdata/klein-tiny (KLEIN_TESTDATA at configure time, or the env var of that name).
std::filesystem::path tiny_dir();
// ../shared/testdata/zimage-tiny, beside tiny_dir().
inline std::filesystem::path zimage_dir() { return tiny_dir().parent_path() / "zimage-tiny"; }
// Its model directory.
inline std::filesystem::path zimage_model() { return zimage_dir() / "model"; }
// ../shared/testdata/upsample-tiny and safety-tiny.
inline std::filesystem::path upsample_dir() { return tiny_dir().parent_path() / "upsample-tiny"; }
inline std::filesystem::path safety_dir() { return tiny_dir().parent_path() / "safety-tiny"; }
#ifdef KLEIN_SOURCE_DIR
// The repository's own test data: the tiny FLUX.2-dev set and TAEF2's published weights.
inline std::filesystem::path dev_set() {
  return std::filesystem::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "flux2-dev-tiny";
}
// The repository.
inline const std::filesystem::path kSource = KLEIN_SOURCE_DIR;
inline std::filesystem::path taef2_dir() {
  return std::filesystem::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "taef2";
}
#endif
// The running test's name (GoogleTest's, without its suite).
inline std::string test_name() {
  return ::testing::UnitTest::GetInstance()->current_test_info()->name();
}
std::filesystem::path tiny_model();    // tiny_dir()/model
std::filesystem::path tiny_vectors();  // tiny_dir()/vectors
// A fresh empty directory under the build's temp area, removed by nobody (ctest is short-lived).
std::filesystem::path temp_dir(const std::string& name);

// A fixture made once and then only read: the directory `make` filled. When the suite runs
// through scripts/test.sh, KLEIN_TEST_FIXTURES names a directory of that run (removed after
// it), and the first test process to ask for `key` makes it there while the others wait for
// it (a file lock): every test program of the run shares one conversion of the tiny model, one
// set of the scripts' fixtures. Without it, each process makes its own, in its temp_dir. `key`
// is a file name; nothing may write into the directory after `make` (copy what a test
// changes).
// `make` returns whether it made the fixture (a failed one is made again by the next asker).
std::filesystem::path shared_fixture(const std::string& key,
                                     const std::function<bool(const std::filesystem::path&)>& make);

// BFL's 46 watermark bits ("0"/"1") as the official library's fixtures record them
// (tests/data/watermark/manifest.json, written by tools/watermark/official.py).
std::string official_watermark_bits();

// The tiny model's tokenizer as the one-file tokenizer.json of the Hugging Face tokenizers
// library, `variant` "merge-strings" or "merge-pairs" (the layout of the Qwen3 repositories),
// written once (shared_fixture) by tools/tokenizer_json/make_fixture.py from vocab.json,
// merges.txt and tokenizer_config.json; the pair variant must come out with the SHA-256 of the
// published Qwen3 file. A test failure when the script fails.
std::filesystem::path tokenizer_json_fixture(const std::string& variant);

// The directory of the tiny transformer's LoRA fixtures (peft.safetensors, bfl.safetensors,
// kohya.safetensors: one per key spelling, random values from fixed seeds), written once
// (shared_fixture) by `tools/lora/lora_fixture.py make`.
std::filesystem::path lora_fixtures();
// The same for the tiny Z-Image transformer (zimage-peft, zimage-comfy, zimage-kohya:
// `tools/lora/lora_fixture.py make-zimage`).
std::filesystem::path zimage_lora_fixtures();

// The FNV-1a 64-bit hash of `n` bytes as 16 lower-case hex digits (the fixtures' manifests
// name tensors and images by it).
std::string fnv1a64(const void* data, size_t n);

// A file written with exactly these bytes (a test failure when it cannot be).
void write_text(const std::filesystem::path& path, const std::string& text);

// max|a - b| / max|ref|, the scaled difference the golden tolerances are stated in.
double scaled_diff(const float* got, const float* ref, int64_t n);

// Asserts that `got` matches the reference .npy (same element count) within `tol` scaled
// difference, and reports the worst element on failure.
::testing::AssertionResult matches_npy(const float* got, int64_t n,
                                       const std::filesystem::path& ref, double tol);
::testing::AssertionResult matches_npy(const Tensor& got, const std::filesystem::path& ref,
                                       double tol);

// The message of the klein::Error that f throws; a test failure (and "") when it throws
// nothing or another exception.
std::string error_of(const std::function<void()>& f);

// n normally distributed values (mean 0, standard deviation `scale`) from a fixed seed, and a
// tensor of them (scale 1).
std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 1.0f);
Tensor random_tensor(Shape shape, uint32_t seed);

// Runs the klein CLI with arguments; returns the exit code and captures stdout+stderr.
int run_klein(const std::string& args, std::string* output = nullptr);

// `klein convert -m <the tiny model> ARGS -o OUT`: success, or a failure that shows the
// command's output. `log`, when given, receives the output either way. Without `log`, the
// conversion is a shared_fixture (one per ARGS in a run) copied to OUT.
::testing::AssertionResult convert_tiny(const std::filesystem::path& out, const std::string& args,
                                        std::string* log = nullptr);

// `klein ARGS --json`: the first JSON object line of its output (an empty object, and a test
// failure showing the output, when there is none or the exit status is not `status`).
nlohmann::json klein_json(const std::string& args, int status = 0);

// A path quoted for the shell of run_klein.
std::string shell_arg(const std::filesystem::path& p);

// The tiny model given as single files (--diffusion-model, --text-encoder, --vae, --tokenizer,
// --variant 4b), with `transformer` as the diffusion model.
std::string tiny_components(const std::filesystem::path& transformer);

}  // namespace klein::testing
