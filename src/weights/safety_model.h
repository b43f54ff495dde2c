#pragma once
// The image safety classifier that FLUX.2's reference runs on every input and output image
// (Falconsai/nsfw_image_detection: transformers' ViTForImageClassification, ViT-B/16 at
// 224x224, labels normal / nsfw), read from its Hugging Face directory:
//   config.json                 ViTConfig (checked: gelu, q/k/v biases, the label set)
//   model.safetensors           the weights, under transformers' names
//   preprocessor_config.json    ViTImageProcessor (resize, rescale, normalise)
// Everything is checked before any pixel is read: the configuration's keys and values, every
// tensor's presence, type and shape, and nothing left over.
//
// Units and the names inside them (canonical names are "safety." + transformers' name):
//   safety.embeddings   prefix "safety.vit.embeddings."   cls_token [1, 1, D],
//                       position_embeddings [1, T, D], patch_embeddings.projection.{weight
//                       [D, C, P, P], bias [D]}
//   safety.layer.{i}    prefix "safety.vit.encoder.layer.{i}."   layernorm_before.*,
//                       attention.attention.{query,key,value}.*, attention.output.dense.*,
//                       layernorm_after.*, intermediate.dense.*, output.dense.*
//   safety.head         prefix "safety."   vit.layernorm.*, classifier.{weight [L, D], bias [L]}
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/tensor.h"
#include "weights/expected.h"
#include "weights/extra_component.h"
#include "weights/naming.h"
#include "weights/weight_store.h"

namespace klein {

// ViTConfig's values that the network depends on (transformers' defaults where a key is
// absent, as ViTConfig has them).
struct VitConfig {
  int64_t hidden = 768;         // "hidden_size"
  int64_t num_layers = 12;      // "num_hidden_layers"
  int64_t num_heads = 12;       // "num_attention_heads"
  int64_t intermediate = 3072;  // "intermediate_size"
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t channels = 3;  // "num_channels"
  double layer_norm_eps = 1e-12;
  std::vector<std::string> labels;  // id2label, in id order

  int64_t head_dim() const { return hidden / num_heads; }
  int64_t grid() const { return image_size / patch_size; }  // patches per side
  int64_t patches() const { return grid() * grid(); }
  int64_t tokens() const { return patches() + 1; }  // CLS first
  int64_t patch_values() const { return channels * patch_size * patch_size; }
  // The id of a label; -1 when the classifier has none of that name.
  int64_t label_id(const std::string& label) const;
};

// ViTImageProcessor's preprocessor_config.json: resize to height x width with PIL's
// BILINEAR (the only resample it may name), rescale, normalise per channel.
struct VitImageProcessor {
  bool do_resize = true;
  int height = 224, width = 224;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::array<float, 3> image_mean = {0.5f, 0.5f, 0.5f};
  std::array<float, 3> image_std = {0.5f, 0.5f, 0.5f};
};

// Parsers; `where` names the file in errors.
VitConfig parse_vit_config(const nlohmann::json& j, const std::string& where);
VitImageProcessor parse_vit_image_processor(const nlohmann::json& j, const std::string& where);

// The unit of a canonical safety tensor ("safety.vit.encoder.layer.3.output.dense.weight"),
// or nothing for a name outside the classifier.
std::optional<UnitOf> safety_unit_of(const std::string& canonical);
// Unit names.
inline constexpr const char* kSafetyEmbeddingsUnit = "safety.embeddings";
inline constexpr const char* kSafetyHeadUnit = "safety.head";
std::string safety_layer_unit(int64_t layer);

// Every tensor the classifier of this configuration has: canonical name -> shape.
ShapeMap expected_safety_tensors(const VitConfig& c);

struct SafetyModel {
  std::unique_ptr<WeightStore> store;  // units above; store->config() is a placeholder
  VitConfig config;
  VitImageProcessor processor;
  std::filesystem::path path;  // what it was opened from, for messages
  // The two configuration files as read (what a container stores of them).
  nlohmann::json config_json, processor_json;
};

// Opens the classifier of a Hugging Face directory (the three files above; a sharded
// model.safetensors.index.json is read too), or the one a klein container holds (klein
// convert --safety-model: its units beside the model's, quantized by the policy, and the two
// configuration files in the metadata's "safety" object). Throws klein::Error naming the
// file, key or tensor that is missing or not what this classifier needs: another layout, a
// label set without "nsfw" and "normal", an activation other than gelu; a container without
// a classifier.
SafetyModel open_safety_model(const std::filesystem::path& path);

// Whether the container at `path` holds a classifier (false for anything else).
bool container_has_safety_model(const std::filesystem::path& path);

// The classifier as a network stored beside a model by convert (its store moves into it).
ExtraComponent safety_component(SafetyModel model);

// The container metadata's "safety" object for a classifier: its two configuration files and
// where it came from.
nlohmann::json safety_container_metadata(const SafetyModel& model);
// Its inverse, as a container is read: the configurations of a "safety" object, checked (no
// store yet). `where` names the container in messages.
SafetyModel safety_model_from_metadata(const nlohmann::json& safety, const std::string& where);

}  // namespace klein
