#include "server/server.h"

#include <httplib.h>
#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/image/image.h"
#include "pipeline/noise.h"
#include "pipeline/preview.h"
#include "server/page.h"
#include "server/requests.h"
#include "core/base64.h"

namespace klein {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace requests;

const char* status_name(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
  }
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
    if (!o.seed) o.seed = random_seed();  // below 2^32: seed + i stays exact for every client
    const uint64_t first_seed = *o.seed;
    LiveProgress progress(*this);
    const StepHook preview = [this](const StepView& v) {
      const std::string b64 =
          base64_encode(png_bytes(v.preview()));
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

  // OpenAI: {"created": t, "data": [{"b64_json": ..., "revised_prompt": ...}]}; seed and
  // seed_str are extensions.
  static json openai_reply(const Made& made, const std::string& prompt) {
    json data = json::array();
    for (size_t i = 0; i < made.png.size(); ++i)
      data.push_back({{"b64_json", made.png[i]}, {"revised_prompt", prompt},
                      {"seed", made.seeds[i]}, {"seed_str", std::to_string(made.seeds[i])}});
    return {{"created", int64_t(std::time(nullptr))}, {"data", data}};
  }

  json openai_generations(const httplib::Request& req) {
    ImageRequest r = read_openai_request(parse_json(req), options);
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
    ImageRequest r = read_openai_request(body, options);

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
    A1111Request a = read_a1111_request(body, options, img2img);
    ImageRequest& r = a.request;
    UploadDir uploads;
    if (img2img) {
      r.options.init_image = uploads.write("init_images", a.init_image);
      if (!a.mask.empty()) r.options.mask = uploads.write("mask", a.mask);
    }
    const Made made = generate(std::move(r));
    const GenerateResult& first = made.first;
    json seed_strings = json::array();
    for (uint64_t seed : made.seeds) seed_strings.push_back(std::to_string(seed));
    json info = {{"prompt", body.value("prompt", "")},
                 {"negative_prompt", body.value("negative_prompt", "")},
                 {"seed", made.seeds.front()},
                 {"all_seeds", made.seeds},
                 {"seed_str", seed_strings.front()},  // extensions: the seeds as strings
                 {"all_seeds_str", seed_strings},
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
