// The AUTOMATIC1111 API: /sdapi/v1/txt2img and img2img, progress, the LoRAs, interrupt.
#include "server/impl.h"

namespace klein::serve {

using namespace requests;

namespace {

// {"images": [...], "parameters": request, "info": "<json text>"}
json generate_images(Impl& s, const httplib::Request& req, bool img2img) {
  const json body = parse_json(req);
  A1111Request a = read_a1111_request(body, s.options, img2img);
  ImageRequest& r = a.request;
  UploadDir uploads;
  place_uploads(r, uploads);
  const Made made =
      generate_now(s, std::move(r), req, img2img ? "/sdapi/v1/img2img" : "/sdapi/v1/txt2img");
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
  parameters.erase("control_image");
  return {{"images", made.png}, {"parameters", parameters}, {"info", info.dump()}};
}

// The fraction of the running request's denoising done, the time left at that rate, the
// state, and the latest step preview.
json progress(Impl& s) {
  const std::lock_guard lock(s.live_mutex);
  const Impl::Live& live = s.live;
  if (!live.active)
    return {{"progress", 0.0},
            {"eta_relative", 0.0},
            {"current_image", nullptr},
            {"state", {{"job_count", 0}, {"sampling_step", 0}, {"sampling_steps", 0}}}};
  const double fraction = live.fraction();
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

json loras(const Impl& s) {
  json list = json::array();
  for (const auto& [name, _] : s.loras) list.push_back({{"name", name}, {"alias", name}});
  return list;
}

// Cancels the running request (whichever route it came through); it answers 503.
json interrupt(Impl& s) {
  bool active;
  {
    const std::lock_guard lock(s.live_mutex);
    active = s.live.active;
  }
  if (active) {
    {
      const std::lock_guard lock(s.mutex);
      s.interrupted = true;
    }
    s.cx.cancel();
  }
  return {{"interrupted", active}};
}

}  // namespace

void add_a1111_routes(httplib::Server& http, Impl& s) {
  http.Post("/sdapi/v1/txt2img",
            api_route(s, Api::A1111, "/sdapi/v1/txt2img",
                      [&s](const httplib::Request& req, httplib::Response&) {
                        return generate_images(s, req, false);
                      }));
  http.Post("/sdapi/v1/img2img",
            api_route(s, Api::A1111, "/sdapi/v1/img2img",
                      [&s](const httplib::Request& req, httplib::Response&) {
                        return generate_images(s, req, true);
                      }));
  http.Get("/sdapi/v1/progress",
           api_route(s, Api::A1111, "/sdapi/v1/progress",
                     [&s](const httplib::Request&, httplib::Response&) { return progress(s); }));
  http.Get("/sdapi/v1/loras",
           api_route(s, Api::A1111, "/sdapi/v1/loras",
                     [&s](const httplib::Request&, httplib::Response&) { return loras(s); }));
  http.Post("/sdapi/v1/interrupt",
            api_route(s, Api::A1111, "/sdapi/v1/interrupt",
                      [&s](const httplib::Request&, httplib::Response&) { return interrupt(s); }));
}

}  // namespace klein::serve
