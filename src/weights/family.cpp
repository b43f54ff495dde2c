#include "weights/family.h"

#include "core/error.h"
#include "core/json_fields.h"
#include "weights/safety_model.h"

namespace klein {

using json = nlohmann::json;

namespace {

std::vector<const ModelFamily*>& registered_families() {
  static std::vector<const ModelFamily*> all;
  return all;
}

}  // namespace

void register_model_family(const ModelFamily& family) {
  for (const ModelFamily* f : registered_families())
    check(f->id() != family.id(), "model family \"", family.id(), "\" registered twice");
  registered_families().push_back(&family);
}

const std::vector<const ModelFamily*>& model_families() {
  check(!registered_families().empty(),
        "no model family is registered in this program (it must link klein_families: "
        "src/families/registry.cpp)");
  return registered_families();
}

std::string family_titles() {
  const auto& all = model_families();
  std::string text;
  for (size_t i = 0; i < all.size(); ++i)
    text += std::string(i == 0                ? ""
                        : i + 1 == all.size() ? " or "
                                              : ", ") +
            std::string(all[i]->title());
  return text;
}

const ModelFamily& model_family(std::string_view id, const std::string& where) {
  std::string known;
  for (const ModelFamily* f : model_families()) {
    if (f->id() == id) return *f;
    known += std::string(known.empty() ? "" : ", ") + std::string(f->id());
  }
  fail(where, where.empty() ? "" : ": ", "unknown model family \"", id, "\" (this build knows ",
       known, ")");
}

const ModelFamily& family_of_pipeline(const std::string& class_name, const std::string& where) {
  std::string known;
  for (const ModelFamily* f : model_families())
    for (const std::string& c : f->pipeline_classes()) {
      if (c == class_name) return *f;
      known += (known.empty() ? "" : ", ") + c;
    }
  fail(where, ": pipeline class ", class_name, " is not one this engine runs (", known, ")");
}

ExtraComponent ModelFamily::open_control_model(const std::filesystem::path& path,
                                               const ModelConfig&) const {
  fail("--controlnet ", path.string(), ": ", title(), " has no control model");
}

std::optional<UnitOf> unit_of(const ModelFamily& family, const std::string& canonical) {
  if (canonical.starts_with("transformer.")) return family.transformer_unit_of(canonical);
  if (canonical.starts_with("safety.")) return safety_unit_of(canonical);
  if (canonical.starts_with("controlnet.")) return family.control_unit_of(canonical);
  if (canonical.starts_with("tiny_vae.")) return tiny_vae_unit_of(canonical);
  return component_unit_of(canonical);
}

ShapeMap expected_tensors(const ModelConfig& c, Component component) {
  switch (component) {
    case Component::Transformer:
      return model_family(c).expected_transformer(c);
    case Component::TextEncoder:
      return expected_text_encoder(c.text_encoder);
    case Component::Vae:
      return expected_vae(c.vae);
  }
  return {};
}

}  // namespace klein
