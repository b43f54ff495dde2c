// The routes around the APIs: the web page, /health for a load balancer and /metrics for a
// scraper. /health and /metrics need no API key: a probe and a scraper usually carry none,
// and neither tells anything about the images.
#include "core/memory.h"
#include "models/taesd/taesd.h"
#include "server/impl.h"
#include "server/page.h"

namespace klein::serve {

namespace {

json health(Impl& s, httplib::Response& res) {
  const Model* m = s.model.load();
  bool busy;
  int queue;
  {
    const std::lock_guard lock(s.mutex);
    busy = s.running;
    queue = s.waiting();
  }
  if (!m) res.status = 503;  // not ready: a load balancer sends nothing here yet
  json reply = {{"status", m ? "ok" : "loading"},
                {"model", m ? json(m->name) : json(nullptr)},
                {"busy", busy},
                {"queue", queue}};
  reply["safety"] = {{"enabled", s.options.safety.on()}};
  if (s.options.safety.on()) {
    reply["safety"]["threshold"] = s.options.safety.threshold;
    reply["safety"]["action"] = safety_action_name(s.options.safety.action);
  }
  reply["prompt_check"] = {{"enabled", s.options.check_prompt}};
  // The server's tiny decoder (--tiny-vae), else the container's.
  const Capabilities c = m ? capabilities(*m) : Capabilities{};
  const std::string tiny = s.options.tiny.on() ? s.options.tiny.model->path().filename().string()
                                               : c.stored_tiny_decoder;
  reply["tiny_decoder"] = {{"enabled", !tiny.empty()}};
  if (!tiny.empty()) reply["tiny_decoder"]["file"] = tiny;
  if (m) {
    // What this model's requests may carry beyond a prompt (the page shows only these).
    reply["family"] = c.family;
    reply["accepts"] = {{"references", c.references},
                        {"init_image", c.image_to_image},
                        {"mask", c.image_to_image},
                        {"guidance", c.guidance},
                        {"negative_prompt", c.negative_prompt},
                        {"cfg_normalization", c.guidance_options},
                        {"cfg_truncation", c.guidance_options},
                        {"cache", c.step_cache},
                        {"loras", c.loras},
                        {"control_image",
                         c.control && (!s.options.controlnet.empty() || c.stored_control_model)},
                        {"upsample", s.options.upsample_endpoint.has_value() ||
                                         upsample_unavailable(*m).empty()}};
    reply["defaults"] = {{"steps", c.default_steps}, {"guidance", c.default_guidance}};
  }
  // The bounds a request is checked against, and whether it needs the API key.
  reply["limits"] = {{"max_side", s.options.max_side},
                     {"max_images", s.options.max_images},
                     {"max_references", requests::kMaxReferences},
                     {"max_steps", kMaxSteps}};
  reply["auth"] = !s.options.api_key.empty();
  return reply;
}

std::string metrics_text(Impl& s) {
  Metrics::Gauges g;
  g.jobs = kept_jobs(s);
  {
    const std::lock_guard lock(s.mutex);
    g.queue = s.waiting();
    g.running = s.running;
  }
  g.ready = s.model.load() != nullptr;
  g.peak_rss = peak_rss_bytes();
  return s.metrics.render(g);
}

}  // namespace

void add_service_routes(httplib::Server& http, Impl& s) {
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kServerPage, "text/html; charset=utf-8");
  });
  http.Get("/health", [&s](const httplib::Request&, httplib::Response& res) {
    res.set_content(health(s, res).dump(), "application/json");
  });
  http.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(s), "text/plain; version=0.0.4; charset=utf-8");
  });
}

}  // namespace klein::serve
