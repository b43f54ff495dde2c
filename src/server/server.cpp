#include "server/server.h"

#include <httplib.h>
#include <stdlib.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/image/image.h"
#include "pipeline/preview.h"
#include "server/page.h"
#include "core/base64.h"

namespace klein {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// An answer other than 200, with its message: thrown by the handlers, turned into the error
// body of the API the request came through.
struct HttpError {
  int status;
  std::string message;
};

HttpError bad_request(const std::string& message) { return {400, message}; }

// What one request asks the pipeline for: `count` images from these options, seeds counting
// up from the first (a random first seed when none is given).
struct ImageRequest {
  GenerateOptions options;
  int count = 1;
};

const char* status_name(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
  }
}

// --- reading request fields ------------------------------------------------------------------

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

int64_t in_range(int64_t v, int64_t lo, int64_t hi, const char* key) {
  if (v < lo || v > hi)
    throw bad_request(std::string("\"") + key + "\": expected " + std::to_string(lo) + " to " +
                      std::to_string(hi) + ", got " + std::to_string(v));
  return v;
}

// "WxH" (OpenAI's size); "auto" or absent: the model's default (or the first image's).
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

// The options every API shares: steps, guidance, seed, negative prompt.
void read_common(const json& body, const ServerOptions& s, GenerateOptions& o,
                 const char* guidance_key) {
  if (auto v = get<int64_t>(body, "steps")) o.steps = in_range(*v, 1, kMaxSteps, "steps");
  if (auto v = get<double>(body, guidance_key)) {
    if (!(*v >= 0 && *v <= 100))
      throw bad_request(std::string("\"") + guidance_key + "\": expected 0 to 100");
    o.guidance = float(*v);
  }
  if (auto v = get<std::string>(body, "negative_prompt")) o.negative_prompt = *v;
  if (body.contains("seed") && !body["seed"].is_null()) {
    const json& seed = body["seed"];
    if (seed.is_number_unsigned()) {
      o.seed = seed.get<uint64_t>();
    } else if (!(seed.is_number_integer() && seed.get<int64_t>() == -1)) {
      throw bad_request("\"seed\": expected an integer from 0 to 2^64-1, or -1 for a random one");
    }
  }
  o.max_memory = s.max_memory;
  o.residency = s.residency;
  o.precision = s.precision;
}

// The LoRAs of --lora-dir: file name without ".safetensors" -> path.
std::map<std::string, fs::path> list_loras(const fs::path& dir) {
  std::map<std::string, fs::path> out;
  if (dir.empty()) return out;
  check(fs::is_directory(dir), "--lora-dir ", dir.string(), ": not a directory");
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
      out[entry.path().stem().string()] = entry.path();
  return out;
}

// A1111's extra-network syntax: every <lora:NAME> or <lora:NAME:SCALE> leaves the prompt and
// adds that LoRA of the server's list, in order.
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

// A per-request directory for uploaded images (the pipeline reads files), removed with it.
class UploadDir {
 public:
  UploadDir() {
    std::string pattern = (fs::temp_directory_path() / "klein-serve-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw HttpError{500, "cannot create a directory for uploads"};
    dir_ = pattern;
  }
  ~UploadDir() {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  UploadDir(const UploadDir&) = delete;
  UploadDir& operator=(const UploadDir&) = delete;

  // Writes the bytes as an image file named after the request field.
  fs::path write(const std::string& field, const std::string& bytes) {
    if (bytes.empty()) throw bad_request("\"" + field + "\": the image is empty");
    std::string name;
    for (char c : field) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    const fs::path path = dir_ / (name + ".img");
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out) throw HttpError{500, "cannot store the upload \"" + field + "\""};
    return path;
  }

 private:
  fs::path dir_;
};

// An A1111 image field: base64, possibly a data URL.
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

}  // namespace

// --- the server ------------------------------------------------------------------------------

struct Server::Impl {
  Model& model;
  Compute& cx;
  ServerOptions options;
  httplib::Server http;
  int port = 0;

  // One generation at a time; the others wait in turn.
  std::mutex mutex;
  std::condition_variable turn;
  bool running = false;
  int waiting = 0;
  bool stopping = false;

  std::map<std::string, fs::path> loras;  // --lora-dir

  Impl(Model& m, Compute& c, ServerOptions o)
      : model(m), cx(c), options(std::move(o)), loras(list_loras(options.lora_dir)) {}

  // Holds the generation slot for the lifetime of the object.
  class Slot {
   public:
    explicit Slot(Impl& s) : s_(s) {
      std::unique_lock lock(s_.mutex);
      if (s_.stopping) throw HttpError{503, "the server is shutting down"};
      if (s_.running && s_.waiting >= s_.options.max_queue)
        throw HttpError{429, "busy: " + std::to_string(s_.waiting) +
                                 " requests are already waiting (--max-queue " +
                                 std::to_string(s_.options.max_queue) + ")"};
      ++s_.waiting;
      s_.turn.wait(lock, [&] { return !s_.running || s_.stopping; });
      --s_.waiting;
      if (s_.stopping) throw HttpError{503, "the server is shutting down"};
      s_.running = true;
    }
    ~Slot() {
      {
        const std::lock_guard lock(s_.mutex);
        s_.running = false;
      }
      s_.turn.notify_all();
    }

   private:
    Impl& s_;
  };

  struct Made {
    std::vector<std::string> png;  // base64 PNG files, with their metadata
    std::vector<uint64_t> seeds;
    std::vector<std::string> infotexts;
    GenerateResult first;
  };

  // Runs the request's images through the stages. Input the pipeline refuses in start() is
  // the client's fault (400); later failures are ours (500); cancellation by stop() is 503.
  // What /sdapi/v1/progress shows of the running request: its phase and step, and the step
  // preview as a base64 PNG. Guarded by live_mutex.
  struct Live {
    bool active = false;
    std::string phase;
    int image = 0, images = 0;  // 0-based image of the request, and how many
    int step = 0, steps = 0;    // denoising steps done, of steps
    std::string preview;        // base64 PNG of the last step's preview
    std::chrono::steady_clock::time_point started;
  };
  std::mutex live_mutex;
  Live live;
  bool interrupted = false;  // /sdapi/v1/interrupt for the running request (guarded by mutex)

  // The pipeline's progress events into `live`.
  class LiveProgress final : public Progress {
   public:
    explicit LiveProgress(Impl& s) : s_(s) {}
    void begin(const std::string& phase, int total) override {
      const std::lock_guard lock(s_.live_mutex);
      s_.live.phase = phase;
      if (phase == "denoise") s_.live.step = 0, s_.live.steps = total;
    }
    void step(const std::string& phase, int done, int total) override {
      if (phase != "denoise") return;
      const std::lock_guard lock(s_.live_mutex);
      s_.live.step = done;
      s_.live.steps = total;
    }

   private:
    Impl& s_;
  };

  HttpError cancelled() {
    const std::lock_guard lock(mutex);
    return stopping ? HttpError{503, "cancelled: the server is shutting down"}
                    : HttpError{503, "interrupted (/sdapi/v1/interrupt)"};
  }

  bool should_stop() {
    const std::lock_guard lock(mutex);
    return stopping || interrupted;
  }

  Made generate(ImageRequest request) {
    take_lora_tags(request.options, loras);
    Slot slot(*this);
    {
      const std::lock_guard lock(mutex);
      interrupted = false;
    }
    {
      const std::lock_guard lock(live_mutex);
      live = Live{true, "queued", 0, request.count, 0, 0, "", std::chrono::steady_clock::now()};
    }
    struct Idle {  // the live view goes back to idle however this ends
      Impl& s;
      ~Idle() {
        const std::lock_guard lock(s.live_mutex);
        s.live.active = false;
      }
    } idle{*this};
    Made made;
    GenerateOptions& o = request.options;
    if (!o.seed) o.seed = std::random_device{}() | (uint64_t(std::random_device{}()) << 32);
    const uint64_t first_seed = *o.seed;
    LiveProgress progress(*this);
    const StepHook preview = [this](const StepView& v) {
      const std::string b64 =
          base64_encode(png_bytes(step_preview(v.latents_in, v.velocity, v.sigma, v.grid)));
      const std::lock_guard lock(live_mutex);
      live.preview = b64;
    };
    for (int i = 0; i < request.count; ++i) {
      o.seed = first_seed + uint64_t(i);
      {
        const std::lock_guard lock(live_mutex);
        live.image = i;
      }
      Session session(model, cx);
      Generation g;
      try {
        g = session.start(o, progress);
      } catch (const Cancelled&) {
        throw cancelled();
      } catch (const Error& e) {
        throw bad_request(e.what());
      }
      // start() clears the cancel flag: a stop or interrupt that came before it counts here.
      if (should_stop()) throw cancelled();
      try {
        session.encode_prompt(g, progress);
        session.prepare_latents(g, progress);
        session.denoise(g, progress, preview);
        session.decode(g, progress);
      } catch (const Cancelled&) {
        throw cancelled();
      } catch (const Error& e) {
        throw HttpError{500, e.what()};
      }
      const GenerateResult& r = g.result;
      const std::string text = parameters_text(o, r, model.name);
      const ImageMetadata meta = {
          {"parameters", text},
          {"klein", parameters_json(o, r, model.name, model.checksum)}};
      made.png.push_back(base64_encode(png_bytes(r.image, meta)));
      made.seeds.push_back(r.seed.value_or(0));
      made.infotexts.push_back(text);
      if (i == 0) made.first = r;
    }
    return made;
  }

  // A1111's progress: the fraction of the request's denoising done, the time left at that
  // rate, the state, and the latest step preview.
  json progress_reply() {
    const std::lock_guard lock(live_mutex);
    if (!live.active)
      return {{"progress", 0.0}, {"eta_relative", 0.0}, {"current_image", nullptr},
              {"state", {{"job_count", 0}, {"sampling_step", 0}, {"sampling_steps", 0}}}};
    const double fraction =
        live.images == 0
            ? 0.0
            : (live.image + (live.steps > 0 ? double(live.step) / live.steps : 0.0)) / live.images;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - live.started).count();
    const double eta = fraction > 0 ? elapsed / fraction - elapsed : 0.0;
    return {{"progress", fraction},
            {"eta_relative", eta},
            {"current_image", live.preview.empty() ? json(nullptr) : json(live.preview)},
            {"state",
             {{"job", live.phase},
              {"job_count", live.images},
              {"job_no", live.image},
              {"sampling_step", live.step},
              {"sampling_steps", live.steps}}}};
  }

  json interrupt() {
    bool active;
    {
      const std::lock_guard lock(live_mutex);
      active = live.active;
    }
    if (active) {
      {
        const std::lock_guard lock(mutex);
        interrupted = true;
      }
      cx.cancel();
    }
    return {{"interrupted", active}};
  }

  // --- routes --------------------------------------------------------------------------------

  // Compared in time that does not depend on where the first wrong byte is.
  bool authorized(const httplib::Request& req) const {
    if (options.api_key.empty()) return true;
    const std::string expected = "Bearer " + options.api_key;
    const std::string given = req.get_header_value("Authorization");
    unsigned char diff = given.size() == expected.size() ? 0 : 1;
    for (size_t i = 0; i < expected.size(); ++i)
      diff |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
    return diff == 0;
  }

  json parse_json(const httplib::Request& req) const {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object())
      throw bad_request("the request body must be a JSON object");
    return body;
  }

  // OpenAI: {"created": t, "data": [{"b64_json": ..., "revised_prompt": ...}]}
  static json openai_reply(const Made& made, const std::string& prompt) {
    json data = json::array();
    for (size_t i = 0; i < made.png.size(); ++i)
      data.push_back({{"b64_json", made.png[i]}, {"revised_prompt", prompt},
                      {"seed", made.seeds[i]}});  // seed: an extension
    return {{"created", int64_t(std::time(nullptr))}, {"data", data}};
  }

  void check_response_format(const std::optional<std::string>& format) const {
    if (format && *format != "b64_json")
      throw bad_request("\"response_format\": only \"b64_json\" is supported (this server keeps "
                        "no files to link to), got \"" + *format + "\"");
  }

  // The fields both OpenAI routes read: prompt, size, n, response_format and the common ones.
  ImageRequest openai_request(const json& body) const {
    ImageRequest r;
    const auto prompt = get<std::string>(body, "prompt");
    if (!prompt) throw bad_request("\"prompt\": required");
    r.options.prompt = *prompt;
    read_size(get<std::string>(body, "size"), options.max_side, r.options);
    r.count = read_count(get<int64_t>(body, "n"), options.max_images, "n");
    check_response_format(get<std::string>(body, "response_format"));
    read_common(body, options, r.options, "guidance");
    return r;
  }

  json openai_generations(const httplib::Request& req) {
    ImageRequest r = openai_request(parse_json(req));
    const std::string prompt = r.options.prompt;
    return openai_reply(generate(std::move(r)), prompt);
  }

  json openai_edits(const httplib::Request& req) {
    if (!req.is_multipart_form_data())
      throw bad_request("expected multipart/form-data (image, mask, prompt, ...), as the OpenAI "
                        "images API sends it");
    // The text fields as a JSON object (numbers as numbers), read like the JSON APIs' fields.
    json body = json::object();
    for (const auto& [key, field] : req.files) {
      if (!field.filename.empty()) continue;  // an uploaded file
      const bool text = key == "prompt" || key == "negative_prompt" || key == "size" ||
                        key == "response_format" || key == "model";
      const json number = text ? json() : json::parse(field.content, nullptr, false);
      body[key] = number.is_number() ? number : json(field.content);
    }
    ImageRequest r = openai_request(body);

    UploadDir uploads;
    std::vector<fs::path> images;
    for (const char* key : {"image", "image[]"}) {
      const auto [first, last] = req.files.equal_range(key);
      int i = 0;
      for (auto f = first; f != last; ++f)
        images.push_back(uploads.write(std::string(key) + std::to_string(i++), f->second.content));
    }
    if (images.empty()) throw bad_request("\"image\": at least one image file is required");
    if (req.has_file("mask")) {
      // Inpainting: the first image is repainted where the mask is white; the others are
      // references.
      r.options.mask = uploads.write("mask", req.get_file_value("mask").content);
      r.options.init_image = images.front();
      r.options.references.assign(images.begin() + 1, images.end());
      if (auto s = get<double>(body, "strength")) r.options.strength = *s;
    } else {
      if (body.contains("strength"))
        throw bad_request("\"strength\": only with a mask (editing with references keeps no "
                          "part of the image by strength)");
      r.options.references = images;
    }
    const std::string prompt = r.options.prompt;
    return openai_reply(generate(std::move(r)), prompt);
  }

  // A1111: {"images": [...], "parameters": request, "info": "<json text>"}
  json a1111(const httplib::Request& req, bool img2img) {
    const json body = parse_json(req);
    ImageRequest r;
    r.options.prompt = get<std::string>(body, "prompt").value_or("");
    const auto width = get<int64_t>(body, "width"), height = get<int64_t>(body, "height");
    if (width) r.options.width = in_range(*width, 16, options.max_side, "width");
    if (height) r.options.height = in_range(*height, 16, options.max_side, "height");
    if (!img2img) {
      // txt2img defaults to 512x512 in the A1111 API.
      if (!width) r.options.width = 512;
      if (!height) r.options.height = 512;
    }
    const int64_t batch = in_range(get<int64_t>(body, "batch_size").value_or(1), 1,
                                   options.max_images, "batch_size");
    const int64_t iterations = in_range(get<int64_t>(body, "n_iter").value_or(1), 1,
                                        options.max_images, "n_iter");
    r.count = int(in_range(batch * iterations, 1, options.max_images, "batch_size x n_iter"));
    read_common(body, options, r.options, "cfg_scale");

    UploadDir uploads;
    if (img2img) {
      if (!body.contains("init_images") || !body["init_images"].is_array() ||
          body["init_images"].empty())
        throw bad_request("\"init_images\": expected a list with one base64 image");
      if (body["init_images"].size() > 1)
        throw bad_request("\"init_images\": one image is supported, got " +
                          std::to_string(body["init_images"].size()));
      r.options.init_image =
          uploads.write("init_images", decode_image_field(body["init_images"][0], "init_images[0]"));
      if (body.contains("mask") && !body["mask"].is_null())
        r.options.mask = uploads.write("mask", decode_image_field(body["mask"], "mask"));
      if (auto s = get<double>(body, "denoising_strength")) {
        if (!(*s > 0 && *s <= 1))
          throw bad_request("\"denoising_strength\": expected a number in (0, 1]");
        r.options.strength = *s;
      }
    }
    const Made made = generate(std::move(r));
    const GenerateResult& first = made.first;
    json info = {{"prompt", body.value("prompt", "")},
                 {"negative_prompt", body.value("negative_prompt", "")},
                 {"seed", made.seeds.front()},
                 {"all_seeds", made.seeds},
                 {"width", first.width},
                 {"height", first.height},
                 {"steps", first.steps},
                 {"cfg_scale", first.guidance},
                 {"sampler_name", "Euler"},
                 {"infotexts", made.infotexts}};
    if (first.strength) info["denoising_strength"] = *first.strength;
    json parameters = body;
    if (img2img) parameters.erase("init_images"), parameters.erase("mask");  // no echo of images
    return {{"images", made.png}, {"parameters", parameters}, {"info", info.dump()}};
  }

  // Runs a handler: the reply as JSON, or the error in the API family's shape.
  template <class Fn>
  httplib::Server::Handler route(bool openai, Fn fn) {
    return [this, openai, fn](const httplib::Request& req, httplib::Response& res) {
      int status = 200;
      std::string message;
      try {
        if (!authorized(req)) throw HttpError{401, "missing or wrong API key (Authorization: Bearer KEY)"};
        const json reply = fn(req);
        res.set_content(reply.dump(), "application/json");
        return;
      } catch (const HttpError& e) {
        status = e.status;
        message = e.message;
      } catch (const std::bad_alloc&) {
        status = 500;
        message = "out of memory";
      } catch (const std::exception& e) {
        status = 500;
        message = e.what();
      }
      res.status = status;
      const json body =
          openai ? json{{"error", {{"message", message},
                                   {"type", status == 400 || status == 401
                                                ? "invalid_request_error"
                                                : "server_error"},
                                   {"code", status}}}}
                 : json{{"error", status_name(status)}, {"detail", message}};
      res.set_content(body.dump(), "application/json");
    };
  }

  void install_routes() {
    http.set_payload_max_length(options.max_body_bytes);
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(kServerPage, "text/html; charset=utf-8");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      bool busy;
      int queue;
      {
        const std::lock_guard lock(mutex);
        busy = running;
        queue = waiting;
      }
      res.set_content(json{{"status", "ok"},
                           {"model", model.name},
                           {"busy", busy},
                           {"queue", queue}}
                          .dump(),
                      "application/json");
    });
    http.Post("/v1/images/generations",
              route(true, [this](const httplib::Request& q) { return openai_generations(q); }));
    http.Post("/v1/images/edits",
              route(true, [this](const httplib::Request& q) { return openai_edits(q); }));
    http.Post("/sdapi/v1/txt2img",
              route(false, [this](const httplib::Request& q) { return a1111(q, false); }));
    http.Post("/sdapi/v1/img2img",
              route(false, [this](const httplib::Request& q) { return a1111(q, true); }));
    http.Get("/sdapi/v1/progress",
             route(false, [this](const httplib::Request&) { return progress_reply(); }));
    http.Get("/sdapi/v1/loras", route(false, [this](const httplib::Request&) {
               json list = json::array();
               for (const auto& [name, _] : loras) list.push_back({{"name", name}, {"alias", name}});
               return list;
             }));
    http.Post("/sdapi/v1/interrupt",
              route(false, [this](const httplib::Request&) { return interrupt(); }));
  }
};

Server::Server(Model& model, Compute& cx, ServerOptions options)
    : impl_(std::make_unique<Impl>(model, cx, std::move(options))) {
  check(impl_->options.max_queue >= 0, "--max-queue: expected 0 or more, got ",
        impl_->options.max_queue);
  check(impl_->options.port >= 0 && impl_->options.port <= 65535, "--port: expected 0 to 65535, "
        "got ", impl_->options.port);
  impl_->install_routes();
}

Server::~Server() = default;

int Server::bind() {
  Impl& s = *impl_;
  if (s.options.port == 0) {
    s.port = s.http.bind_to_any_port(s.options.host);
    check(s.port > 0, "cannot listen on ", s.options.host, " (any port)");
  } else {
    check(s.http.bind_to_port(s.options.host, s.options.port), "cannot listen on ",
          s.options.host, ":", s.options.port, " (in use, or not an address of this machine)");
    s.port = s.options.port;
  }
  return s.port;
}

void Server::run() { impl_->http.listen_after_bind(); }

void Server::stop() {
  Impl& s = *impl_;
  {
    const std::lock_guard lock(s.mutex);
    s.stopping = true;
  }
  s.turn.notify_all();
  s.cx.cancel();
  s.http.stop();
}

}  // namespace klein
