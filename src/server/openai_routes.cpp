// The OpenAI images API: POST /v1/images/generations (JSON) and /v1/images/edits (multipart).
#include <ctime>
#include <optional>

#include "server/impl.h"

namespace klein::serve {

using namespace requests;

namespace {

json generations(Impl& s, const httplib::Request& req) {
  ImageRequest r = read_openai_json_request(parse_json(req), s.options);
  const std::shared_ptr<UploadDir> uploads = place_uploads(r);  // images given in the body
  const std::string prompt = r.options.prompt;
  return openai_reply(generate_now(s, std::move(r), req, "/v1/images/generations"), prompt);
}

json edits(Impl& s, const httplib::Request& req) {
  if (!req.is_multipart_form_data())
    throw bad_request("expected multipart/form-data (image, mask, prompt, ...), as the OpenAI "
                      "images API sends it");
  // The text fields as a JSON object (numbers and true/false as such), read like the JSON
  // APIs' fields.
  json body = json::object();
  for (const auto& [key, field] : req.files) {
    if (!field.filename.empty()) continue;  // an uploaded file
    const bool text = key == "prompt" || key == "negative_prompt" || key == "size" ||
                      key == "response_format" || key == "model";
    const json number = text ? json() : json::parse(field.content, nullptr, false);
    body[key] = number.is_number() || number.is_boolean() ? number : json(field.content);
  }
  ImageRequest r = read_openai_request(body, s.options);

  UploadDir uploads;
  place_uploads(r, uploads);  // a base64 control image text field, as the JSON APIs take it
  std::vector<std::filesystem::path> images;
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
    if (auto strength = get<double>(body, "strength")) r.options.strength = *strength;
  } else {
    if (body.contains("strength"))
      throw bad_request("\"strength\": only with a mask (editing with references keeps no "
                        "part of the image by strength)");
    r.options.references = images;
  }
  const std::string prompt = r.options.prompt;
  return openai_reply(generate_now(s, std::move(r), req, "/v1/images/edits"), prompt);
}

}  // namespace

// {"created": t, "data": [{"b64_json": ..., "revised_prompt": ...}]}; seed and seed_str are
// extensions.
json openai_reply(const Made& made, const std::string& prompt) {
  json data = json::array();
  for (size_t i = 0; i < made.png.size(); ++i)
    data.push_back({{"b64_json", made.png[i]},
                    {"revised_prompt", made.upsampled_prompt.empty() ? prompt : made.upsampled_prompt},
                    {"seed", made.seeds[i]}, {"seed_str", std::to_string(made.seeds[i])}});
  return {{"created", int64_t(std::time(nullptr))}, {"data", data}};
}

void add_openai_routes(httplib::Server& http, Impl& s) {
  http.Post("/v1/images/generations",
            api_route(s, Api::OpenAI, "/v1/images/generations",
                      [&s](const httplib::Request& req, httplib::Response&) {
                        return generations(s, req);
                      }));
  http.Post("/v1/images/edits",
            api_route(s, Api::OpenAI, "/v1/images/edits",
                      [&s](const httplib::Request& req, httplib::Response&) {
                        return edits(s, req);
                      }));
}

}  // namespace klein::serve
