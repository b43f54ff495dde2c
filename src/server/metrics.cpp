#include "server/metrics.h"

#include <charconv>

namespace klein {

namespace {

// A sample value: integers as integers, others in the shortest form that reads back exactly.
std::string number(double v) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, v).ptr;
  return std::string(text, end);
}

// A label value with backslash, double quote and line feed escaped, as the format requires.
std::string quoted(const std::string& v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '\\' || c == '"')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out + '"';
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + ' ' + help + '\n';
  out += std::string("# TYPE ") + name + ' ' + type + '\n';
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name;
  if (!labels.empty()) out += '{' + labels + '}';
  out += ' ' + number(v) + '\n';
}

}  // namespace

void Metrics::image_done(const std::string& route, double seconds) {
  const std::lock_guard lock(mutex_);
  ++images_[route];
  for (size_t i = 0; i < std::size(kSecondsBuckets); ++i)
    if (seconds <= kSecondsBuckets[i]) ++buckets_[i];
  ++count_;
  sum_ += seconds;
}

void Metrics::error(const std::string& route, const std::string& kind) {
  const std::lock_guard lock(mutex_);
  ++errors_[{route, kind}];
}

void Metrics::phase(const std::string& name, double seconds) {
  const std::lock_guard lock(mutex_);
  phase_seconds_[name] += seconds;
}

std::string Metrics::render(const Gauges& g) const {
  const std::lock_guard lock(mutex_);
  std::string out;
  header(out, "klein_ready", "gauge",
         "1 when the model is open and requests are served, 0 while it loads");
  sample(out, "klein_ready", "", g.ready ? 1 : 0);
  header(out, "klein_queue_depth", "gauge",
         "Requests waiting for their turn (synchronous ones and jobs)");
  sample(out, "klein_queue_depth", "", g.queue);
  header(out, "klein_running", "gauge", "1 while a generation runs");
  sample(out, "klein_running", "", g.running ? 1 : 0);
  header(out, "klein_jobs", "gauge", "Asynchronous jobs kept, in any state");
  sample(out, "klein_jobs", "", g.jobs);
  header(out, "klein_peak_rss_bytes", "gauge", "Peak resident set size of the process");
  sample(out, "klein_peak_rss_bytes", "", double(g.peak_rss));

  header(out, "klein_images_generated_total", "counter", "Images generated, by route");
  for (const auto& [route, n] : images_)
    sample(out, "klein_images_generated_total", "route=" + quoted(route), double(n));
  header(out, "klein_errors_total", "counter",
         "Requests that ended in an error, by route and kind");
  for (const auto& [key, n] : errors_)
    sample(out, "klein_errors_total", "route=" + quoted(key.first) + ",kind=" + quoted(key.second),
           double(n));

  header(out, "klein_generation_seconds", "histogram", "Seconds to generate one image");
  for (size_t i = 0; i < std::size(kSecondsBuckets); ++i)
    sample(out, "klein_generation_seconds_bucket", "le=" + quoted(number(kSecondsBuckets[i])),
           double(buckets_[i]));
  sample(out, "klein_generation_seconds_bucket", "le=\"+Inf\"", double(count_));
  sample(out, "klein_generation_seconds_sum", "", sum_);
  sample(out, "klein_generation_seconds_count", "", double(count_));

  header(out, "klein_phase_seconds_total", "counter", "Seconds spent in each pipeline phase");
  for (const auto& [name, seconds] : phase_seconds_)
    sample(out, "klein_phase_seconds_total", "phase=" + quoted(name), seconds);
  return out;
}

}  // namespace klein
