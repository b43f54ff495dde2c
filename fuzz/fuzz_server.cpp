// libFuzzer target: what `klein serve` reads from a request body, before any generation: the
// OpenAI and AUTOMATIC1111 fields (types, ranges, sizes, seeds, base64 images and data URLs)
// and the <lora:NAME:SCALE> tags of a prompt. Every input must end in options or an HTTP
// error (or klein::Error), never a crash, a hang or a huge allocation.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/requests.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace klein;
  const nlohmann::json body =
      nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size), nullptr, false);
  if (body.is_discarded() || !body.is_object()) return 0;
  ServerOptions options;
  const std::map<std::string, std::filesystem::path> loras = {{"style", "/nonexistent/style.safetensors"},
                                                             {"a:b", "/nonexistent/x.safetensors"}};
  auto each = [&](auto read) {
    try {
      GenerateOptions o = read();
      requests::take_lora_tags(o, loras);
    } catch (const requests::HttpError&) {
    } catch (const Error&) {
    }
  };
  each([&] { return requests::read_openai_request(body, options).options; });
  each([&] { return requests::read_openai_json_request(body, options).options; });
  each([&] { return requests::read_a1111_request(body, options, false).request.options; });
  each([&] { return requests::read_a1111_request(body, options, true).request.options; });
  return 0;
}
