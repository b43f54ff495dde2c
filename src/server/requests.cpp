#include "server/requests.h"

#include <charconv>
#include <cmath>
#include <regex>
#include <stdexcept>
#include <string_view>

#include "core/base64.h"
#include "core/error.h"

namespace klein::requests {

namespace fs = std::filesystem;

int64_t in_range(int64_t v, int64_t lo, int64_t hi, const char* key) {
  if (v < lo || v > hi)
    throw bad_request(std::string("\"") + key + "\": expected " + std::to_string(lo) + " to " +
                      std::to_string(hi) + ", got " + std::to_string(v));
  return v;
}

void read_size(const std::optional<std::string>& size, int64_t max_side, GenerateOptions& o) {
  if (!size || *size == "auto") return;
  const size_t x = size->find('x');
  int64_t w = 0, h = 0;
  try {
    size_t used_w = 0, used_h = 0;
    if (x == std::string::npos) throw std::invalid_argument("no x");
    w = std::stoll(size->substr(0, x), &used_w);
    h = std::stoll(size->substr(x + 1), &used_h);
    if (used_w != x || used_h != size->size() - x - 1) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw bad_request("\"size\": expected \"WIDTHxHEIGHT\" (e.g. \"1024x1024\") or \"auto\", "
                      "got \"" + *size + "\"");
  }
  o.width = in_range(w, 16, max_side, "size (width)");
  o.height = in_range(h, 16, max_side, "size (height)");
}

void read_common(const json& body, const ServerOptions& s, ImageRequest& r,
                 const char* guidance_key) {
  GenerateOptions& o = r.options;
  if (auto v = get<int64_t>(body, "steps")) o.steps = in_range(*v, 1, kMaxSteps, "steps");
  if (auto v = get<double>(body, guidance_key)) {
    if (!(*v >= 0 && *v <= 100))
      throw bad_request(std::string("\"") + guidance_key + "\": expected 0 to 100");
    o.guidance = float(*v);
  }
  if (auto v = get<std::string>(body, "negative_prompt")) o.negative_prompt = *v;
  // Z-Image's guidance options (a FLUX.2-klein model refuses them when the generation starts).
  if (auto v = get<double>(body, "cfg_normalization")) {
    if (!(*v >= 0 && *v <= 100)) throw bad_request("\"cfg_normalization\": expected 0 (off) to 100");
    o.cfg_normalization = float(*v);
  }
  if (auto v = get<double>(body, "cfg_truncation")) {
    if (!(*v >= -100 && *v <= 100)) throw bad_request("\"cfg_truncation\": expected -100 to 100");
    o.cfg_truncation = float(*v);
  }
  // Step caching, "first-block:T" as the CLI's --cache (a family without it refuses it when the
  // generation starts).
  if (auto v = get<std::string>(body, "cache")) {
    try {
      o.step_cache = parse_step_cache(*v, "\"cache\"");
    } catch (const Error& e) {
      throw bad_request(e.what());
    }
  }
  // Z-Image's ControlNet: the control image; the control model is the server's (--controlnet)
  // or the one its container holds (the generation refuses the image when there is neither).
  if (body.contains("control_image") && !body["control_image"].is_null()) {
    o.controlnet = s.controlnet;
    r.control_image = decode_image_field(body["control_image"], "control_image");
    if (r.control_image.empty()) throw bad_request("\"control_image\": the image is empty");
  }
  if (auto v = get<double>(body, "control_scale")) {
    if (!(*v >= -100 && *v <= 100)) throw bad_request("\"control_scale\": expected -100 to 100");
    o.control_scale = float(*v);
  }
  if (body.contains("seed") && !body["seed"].is_null()) {
    const json& seed = body["seed"];
    if (seed.is_number_unsigned()) {
      o.seed = seed.get<uint64_t>();
    } else if (!(seed.is_number_integer() && seed.get<int64_t>() == -1)) {
      throw bad_request("\"seed\": expected an integer from 0 to 2^64-1, or -1 for a random one");
    }
  }
  if (body.contains("watermark")) {
    if (!body["watermark"].is_boolean())
      throw bad_request("\"watermark\": expected true (the default: the invisible mark) or false");
    o.watermark = body["watermark"].get<bool>();
  }
  o.max_memory = s.max_memory;
  o.residency = s.residency;
  o.precision = s.precision;
  // The server's safety check: no request field turns it off (or changes its threshold).
  o.safety = s.safety;
  if (body.contains("upsample")) {
    if (!body["upsample"].is_boolean())
      throw bad_request("\"upsample\": expected true (the prompt rewritten first) or false");
    r.upsample = body["upsample"].get<bool>();
  }
  // The server's tiny decoder (or the container's): previews by it, and the final decode when
  // the request asks (the generation refuses that when there is neither).
  o.tiny = s.tiny;
  if (auto v = get<std::string>(body, "decoder")) {
    if (*v != "full" && *v != "tiny")
      throw bad_request("\"decoder\": expected \"full\" (the model's VAE) or \"tiny\"");
    o.tiny.decode = *v == "tiny";
  }
}

std::map<std::string, fs::path> list_loras(const fs::path& dir) {
  std::map<std::string, fs::path> out;
  if (dir.empty()) return out;
  check(fs::is_directory(dir), "--lora-dir ", dir.string(), ": not a directory");
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
      out[entry.path().stem().string()] = entry.path();
  return out;
}

void take_lora_tags(GenerateOptions& o, const std::map<std::string, fs::path>& available) {
  static const std::regex tag(R"(<lora:([^:<>]+)(?::([^<>]*))?>)");
  std::string rest;
  auto from = o.prompt.cbegin();
  for (std::sregex_iterator it(o.prompt.begin(), o.prompt.end(), tag), end; it != end; ++it) {
    const std::smatch& m = *it;
    rest.append(from, m[0].first);
    from = m[0].second;
    const std::string name = m[1];
    auto found = available.find(name);
    if (found == available.end()) {
      std::string names;
      for (const auto& [n, _] : available) names += (names.empty() ? "" : ", ") + n;
      throw bad_request("\"prompt\": <lora:" + name + "> is not a LoRA of this server (" +
                        (names.empty() ? "it has none; start it with --lora-dir DIR"
                                       : "available: " + names) + ")");
    }
    float scale = 1.0f;
    if (m[2].matched) {
      const std::string text = m[2];
      const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), scale);
      if (ec != std::errc() || p != text.data() + text.size() || !std::isfinite(scale))
        throw bad_request("\"prompt\": <lora:" + name + ":" + text + ">: the scale must be a "
                          "number");
    }
    o.loras.push_back({found->second, scale});
  }
  rest.append(from, o.prompt.cend());
  const size_t first = rest.find_first_not_of(' '), last = rest.find_last_not_of(' ');
  o.prompt = first == std::string::npos ? "" : rest.substr(first, last - first + 1);
}

int read_count(std::optional<int64_t> n, int max_images, const char* key) {
  return int(in_range(n.value_or(1), 1, max_images, key));
}


std::string decode_image_field(const json& v, const std::string& field) {
  if (!v.is_string()) throw bad_request("\"" + field + "\": expected a base64 image string");
  std::string_view text = v.get_ref<const std::string&>();
  if (text.starts_with("data:")) {
    const size_t comma = text.find(',');
    if (comma == std::string_view::npos) throw bad_request("\"" + field + "\": bad data URL");
    text.remove_prefix(comma + 1);
  }
  std::optional<std::string> bytes = base64_decode(text);
  if (!bytes) throw bad_request("\"" + field + "\": not valid base64");
  return *bytes;
}

ImageRequest read_openai_request(const json& body, const ServerOptions& s) {
  ImageRequest r;
  const auto prompt = get<std::string>(body, "prompt");
  if (!prompt) throw bad_request("\"prompt\": required");
  r.options.prompt = *prompt;
  read_size(get<std::string>(body, "size"), s.max_side, r.options);
  r.count = read_count(get<int64_t>(body, "n"), s.max_images, "n");
  const auto format = get<std::string>(body, "response_format");
  if (format && *format != "b64_json")
    throw bad_request("\"response_format\": only \"b64_json\" is supported (this server keeps "
                      "no files to link to), got \"" + *format + "\"");
  read_common(body, s, r, "guidance");
  return r;
}

ImageRequest read_openai_json_request(const json& body, const ServerOptions& s) {
  ImageRequest r = read_openai_request(body, s);
  // Editing in the JSON body (the multipart /v1/images/edits takes files instead): reference
  // images, and an init image with an optional mask and strength.
  if (body.contains("references") && !body["references"].is_null()) {
    const json& refs = body["references"];
    if (!refs.is_array()) throw bad_request("\"references\": expected a list of base64 images");
    if (refs.size() > kMaxReferences)
      throw bad_request("\"references\": at most " + std::to_string(kMaxReferences) +
                        " images, got " + std::to_string(refs.size()));
    for (size_t i = 0; i < refs.size(); ++i) {
      const std::string field = "references[" + std::to_string(i) + "]";
      r.references.push_back(decode_image_field(refs[i], field));
      if (r.references.back().empty()) throw bad_request("\"" + field + "\": the image is empty");
    }
  }
  if (body.contains("init_image") && !body["init_image"].is_null()) {
    r.init_image = decode_image_field(body["init_image"], "init_image");
    if (r.init_image.empty()) throw bad_request("\"init_image\": the image is empty");
  }
  if (body.contains("mask") && !body["mask"].is_null()) {
    if (r.init_image.empty()) throw bad_request("\"mask\": needs \"init_image\" (the image to repaint)");
    r.mask = decode_image_field(body["mask"], "mask");
    if (r.mask.empty()) throw bad_request("\"mask\": the image is empty");
  }
  if (auto v = get<double>(body, "strength")) {
    if (r.init_image.empty()) throw bad_request("\"strength\": needs \"init_image\"");
    if (!(*v > 0 && *v <= 1)) throw bad_request("\"strength\": expected a number in (0, 1]");
    r.options.strength = *v;
  }
  return r;
}

A1111Request read_a1111_request(const json& body, const ServerOptions& s, bool img2img) {
  A1111Request a;
  ImageRequest& r = a.request;
  r.options.prompt = get<std::string>(body, "prompt").value_or("");
  const auto width = get<int64_t>(body, "width"), height = get<int64_t>(body, "height");
  if (width) r.options.width = in_range(*width, 16, s.max_side, "width");
  if (height) r.options.height = in_range(*height, 16, s.max_side, "height");
  if (!img2img) {
    // txt2img defaults to 512x512 in the A1111 API.
    if (!width) r.options.width = 512;
    if (!height) r.options.height = 512;
  }
  const int64_t batch = in_range(get<int64_t>(body, "batch_size").value_or(1), 1,
                                 s.max_images, "batch_size");
  const int64_t iterations = in_range(get<int64_t>(body, "n_iter").value_or(1), 1,
                                      s.max_images, "n_iter");
  r.count = int(in_range(batch * iterations, 1, s.max_images, "batch_size x n_iter"));
  read_common(body, s, r, "cfg_scale");
  if (!img2img) return a;
  if (!body.contains("init_images") || !body["init_images"].is_array() ||
      body["init_images"].empty())
    throw bad_request("\"init_images\": expected a list with one base64 image");
  if (body["init_images"].size() > 1)
    throw bad_request("\"init_images\": one image is supported, got " +
                      std::to_string(body["init_images"].size()));
  r.init_image = decode_image_field(body["init_images"][0], "init_images[0]");
  r.init_field = "init_images";
  if (r.init_image.empty()) throw bad_request("\"init_images[0]\": the image is empty");
  if (body.contains("mask") && !body["mask"].is_null()) {
    r.mask = decode_image_field(body["mask"], "mask");
    if (r.mask.empty()) throw bad_request("\"mask\": the image is empty");
  }
  if (auto v = get<double>(body, "denoising_strength")) {
    if (!(*v > 0 && *v <= 1))
      throw bad_request("\"denoising_strength\": expected a number in (0, 1]");
    r.options.strength = *v;
  }
  return a;
}

}  // namespace klein::requests
