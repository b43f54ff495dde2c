// Tokenizer speed: loading the Qwen3 vocabulary, and encoding a prompt of about 512 tokens
// (the pipeline's full text-encoder length).
#include <benchmark/benchmark.h>

#include <filesystem>

#include "core/files.h"
#include "families/flux2_klein/prompt.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;

fs::path tokenizer_dir() {
  if (const char* env = std::getenv("KLEIN_TESTDATA"))
    return fs::path(env) / "klein-tiny/model/tokenizer";
  return fs::path(KLEIN_TESTDATA) / "klein-tiny/model/tokenizer";
}

// A varied English prompt (words, punctuation, digits, a few non-ASCII characters) repeated
// until it is about 500 tokens long with the template.
std::string long_prompt(const klein::Tokenizer& tokenizer) {
  const std::string sentence =
      "A sprawling panoramic illustration of a floating island city at golden hour, 35mm, f/1.8; "
      "brass airships docked at carved stone piers \xE2\x80\x94 caf\xC3\xA9 lanterns, 2 gulls. ";
  std::string prompt;
  while (tokenizer.encode(klein::klein_chat_text(prompt + sentence)).size() <=
         klein::kKleinMaxTokens)
    prompt += sentence;
  return prompt;
}

void BM_LoadFromDirectory(benchmark::State& state) {
  const fs::path dir = tokenizer_dir();
  for (auto _ : state) {
    klein::Tokenizer t = klein::Tokenizer::from_directory(dir);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_LoadFromDirectory)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// The same files already in memory (as a container would hand them over): parsing only.
void BM_LoadFromMemory(benchmark::State& state) {
  const fs::path dir = tokenizer_dir();
  const std::string vocab = klein::read_text_file(dir / "vocab.json");
  const std::string merges = klein::read_text_file(dir / "merges.txt");
  const std::string config = klein::read_text_file(dir / "tokenizer_config.json");
  klein::TokenizerFiles files;
  files.vocab_json = vocab;
  files.merges_txt = merges;
  files.tokenizer_config_json = config;
  for (auto _ : state) {
    klein::Tokenizer t(files);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_LoadFromMemory)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// tokenizer.json (the layout of the published model, one 11 MB file), made from the same
// vocabulary and merges with the merges written as "A B" strings.
void BM_LoadTokenizerJson(benchmark::State& state) {
  const fs::path dir = tokenizer_dir();
  const std::string merges = klein::read_text_file(dir / "merges.txt");
  std::string json = R"({"added_tokens": [], "model": {"type": "BPE", "vocab": )" +
                     klein::read_text_file(dir / "vocab.json") + R"(, "merges": [)";
  size_t start = merges.find('\n') + 1;  // after the #version line
  for (size_t eol; (eol = merges.find('\n', start)) != std::string::npos; start = eol + 1) {
    // Byte-level symbols never need JSON escapes except '"' and '\\'.
    std::string line;
    for (char c : merges.substr(start, eol - start)) {
      if (c == '"' || c == '\\') line += '\\';
      line += c;
    }
    json += (json.back() == '[' ? "\"" : ",\"") + line + "\"";
  }
  json += "]}}";
  klein::TokenizerFiles files;
  files.tokenizer_json = json;
  for (auto _ : state) {
    klein::Tokenizer t(files);
    benchmark::DoNotOptimize(t);
  }
  state.counters["MB"] = double(json.size()) / 1e6;
}
BENCHMARK(BM_LoadTokenizerJson)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_EncodeKleinPrompt(benchmark::State& state) {
  const klein::Tokenizer tokenizer = klein::Tokenizer::from_directory(tokenizer_dir());
  const std::string prompt = long_prompt(tokenizer);
  const std::string text = klein::klein_chat_text(prompt);
  size_t tokens = 0;
  for (auto _ : state) {
    std::vector<int32_t> ids = tokenizer.encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["tokens"] = double(tokens);
  state.counters["bytes"] = double(text.size());
}
BENCHMARK(BM_EncodeKleinPrompt)->Unit(benchmark::kMicrosecond);

// The whole prompt step of the pipeline: template, encode, truncate/pad, mask.
void BM_TokenizeKleinPrompt(benchmark::State& state) {
  const klein::Tokenizer tokenizer = klein::Tokenizer::from_directory(tokenizer_dir());
  const std::string prompt = long_prompt(tokenizer);
  for (auto _ : state) {
    klein::PromptTokens p = klein::tokenize_klein_prompt(tokenizer, prompt);
    benchmark::DoNotOptimize(p.ids.data());
  }
}
BENCHMARK(BM_TokenizeKleinPrompt)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
