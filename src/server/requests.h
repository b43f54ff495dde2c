#pragma once
// What the server reads from a request, apart from the HTTP plumbing: the fields of the
// OpenAI and AUTOMATIC1111 image APIs into GenerateOptions, each refused with a 400 naming the
// field, and the LoRA tags of a prompt. Functions of the request's JSON (fuzzed by
// fuzz/fuzz_server.cpp): nothing here reads the model or writes a file.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "pipeline/pipeline.h"
#include "server/server.h"

namespace klein::requests {

using json = nlohmann::json;

// An answer other than 200, with its message: thrown by the handlers, turned into the error
// body of the API the request came through. `kind` is its label in /metrics; empty: the
// status's ("bad_request", "unauthorized", "not_found", "queue_full", "internal", ...).
struct HttpError {
  int status;
  std::string message;
  std::string kind = "";
};

inline HttpError bad_request(const std::string& message) { return {400, message}; }

// What one request asks the pipeline for: `count` images from these options, seeds counting
// up from the first (a random first seed when none is given).
struct ImageRequest {
  GenerateOptions options;
  int count = 1;
  // Z-Image's control image ("control_image", base64), written to a file by the route
  // (options.control_image) before the generation; the control model is the server's.
  std::string control_image;
  // Images given in the body ("references", "init_image" and "mask" as base64 or data URLs;
  // A1111's "init_images" and "mask"), written to files the same way before the generation.
  std::vector<std::string> references;
  std::string init_image, mask;
  std::string init_field = "init_image";  // the field it came in (its file is named after it)
  bool upsample = false;  // "upsample": the prompt rewritten before it is encoded
};

// The value of `key` when present and not null, as T; a wrong type is a 400 naming the field.
template <class T>
std::optional<T> get(const json& body, const char* key) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  const json& v = body[key];
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) throw bad_request(std::string("\"") + key + "\": expected a string");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) throw bad_request(std::string("\"") + key + "\": expected a number");
  } else {
    if (!v.is_number_integer())
      throw bad_request(std::string("\"") + key + "\": expected an integer");
  }
  return v.get<T>();
}

int64_t in_range(int64_t v, int64_t lo, int64_t hi, const char* key);
// "WxH" (OpenAI's size); "auto" or absent: the model's default (or the first image's).
void read_size(const std::optional<std::string>& size, int64_t max_side, GenerateOptions& o);
// The options every API shares: steps, guidance, seed, negative prompt, the control image.
void read_common(const json& body, const ServerOptions& s, ImageRequest& r,
                 const char* guidance_key);
int read_count(std::optional<int64_t> n, int max_images, const char* key);
// The LoRAs of --lora-dir: file name without ".safetensors" -> path.
std::map<std::string, std::filesystem::path> list_loras(const std::filesystem::path& dir);
// A1111's extra-network syntax: every <lora:NAME> or <lora:NAME:SCALE> leaves the prompt and
// adds that LoRA of the server's list, in order.
void take_lora_tags(GenerateOptions& o,
                    const std::map<std::string, std::filesystem::path>& available);
// An A1111 image field: base64, possibly a data URL; the decoded bytes.
std::string decode_image_field(const json& v, const std::string& field);

// The fields both OpenAI routes read: prompt, size, n, response_format and the common ones.
ImageRequest read_openai_request(const json& body, const ServerOptions& s);

// An A1111 txt2img or img2img request: the options, and for img2img the decoded bytes of the
// init image and of the mask (empty: none) for the caller to store.
// The most reference images a JSON request may carry (the model's own limit is checked when
// the generation starts).
constexpr size_t kMaxReferences = 10;

// POST /v1/images/generations and /v1/jobs: read_openai_request and, in the JSON body,
// "references" (a list of base64 images or data URLs), "init_image", "mask" (white repaints;
// needs init_image) and "strength" (needs init_image).
ImageRequest read_openai_json_request(const json& body, const ServerOptions& s);

struct A1111Request {
  ImageRequest request;
};
A1111Request read_a1111_request(const json& body, const ServerOptions& s, bool img2img);

}  // namespace klein::requests
