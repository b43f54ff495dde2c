#pragma once
// A model family as the weights layer sees it.
//
// Every family the engine runs shares the kinds of components around its transformer: a
// decoder-only text encoder (Qwen3; FLUX.2-dev's is the language model of Mistral3, the same
// decoder without q/k norms: TextEncoderConfig::qk_norm) and a diffusers VAE, whose names,
// shapes and configuration naming.h, expected.h and config.h know. What a family brings is its
// transformer: how checkpoints name, group and shape its tensors, its configuration, which
// text-encoder layers its pipeline reads, how its latents meet the VAE, and what its
// model_index.json says beyond the components.
//
// The families are registered, not listed here: each is a folder of src/families with one
// line in src/families/registry.cpp. Nothing in the weights layer asks which family a model
// is: the stores, the container and the summaries call the entry of the model's family.
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "weights/config.h"
#include "weights/expected.h"
#include "weights/extra_component.h"
#include "weights/naming.h"

namespace klein {

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;

  // "flux2-klein", "z-image": ModelConfig::family, stored in containers.
  virtual std::string_view id() const = 0;
  // "FLUX.2-klein", "Z-Image": for messages.
  virtual std::string_view title() const = 0;
  // The diffusers pipeline classes (model_index.json "_class_name") of this family.
  virtual std::vector<std::string> pipeline_classes() const = 0;
  // Whether a transformer file's tensors (names as stored) are this family's: how a single
  // file is recognised without a model_index.json.
  virtual bool recognises_transformer(const std::vector<NamedShape>& tensors) const = 0;

  // The transformer's tensors: the layout of a source file, its names mapped to canonical
  // ones ("transformer." + diffusers name; unknown tensors are an error naming them and
  // `where`), the unit of a canonical name, and every tensor's shape for a configuration.
  virtual Layout transformer_layout(const std::vector<NamedShape>& tensors) const = 0;
  virtual std::vector<TensorSource> map_transformer(const std::vector<NamedShape>& tensors,
                                                    const std::string& where) const = 0;
  virtual std::optional<UnitOf> transformer_unit_of(const std::string& canonical) const = 0;
  virtual ShapeMap expected_transformer(const ModelConfig& c) const = 0;

  // The transformer's configuration into `c`: from its config.json (`where` names it), checked
  // against the tensors' canonical shapes when `shapes` is given (`weights_file` names their
  // file); from the shapes alone for a single file; and back to JSON for a container (read
  // again by the first).
  virtual void read_transformer_config(const nlohmann::json& j, const ShapeMap* shapes,
                                       const std::string& where, const std::string& weights_file,
                                       ModelConfig& c) const = 0;
  virtual void infer_transformer_config(const ShapeMap& shapes, const std::string& where,
                                        ModelConfig& c) const = 0;
  virtual nlohmann::json transformer_config_json(const ModelConfig& c) const = 0;

  // The decoder layers (1-based) of a text encoder of `num_layers` layers that the pipeline
  // reads (TextEncoderConfig::output_layers).
  virtual std::vector<int64_t> text_output_layers(int64_t num_layers) const = 0;
  // How this family's latents meet its VAE: VaeConfig::latent_batch_norm, and the scaling and
  // shift factors where the VAE came without a config.json (`from_config` false: a single
  // file, whose factors are the family's published ones).
  virtual void set_vae_latents(VaeConfig& v, bool from_config) const = 0;
  // The scheduler of a checkpoint without scheduler/scheduler_config.json (single files).
  virtual SchedulerConfig default_scheduler() const = 0;

  // What a model_index.json says beyond its components (klein: distilled or base, the K/V
  // pipeline); then --variant, for checkpoints that do not say (`declared`: they did), or,
  // without either, what the transformer file's name says (`transformer_file`).
  virtual void read_model_index(const nlohmann::json& index, ModelConfig& c) const = 0;
  virtual void apply_variant(const std::string& variant, bool declared, const std::string& where,
                             ModelConfig& c) const = 0;
  virtual void decide_undeclared_variant(const std::string& transformer_file,
                                         ModelConfig& c) const = 0;
  // The variant names --variant accepts (empty: none), and the one a configuration is ("" when
  // it is none of them: test models).
  virtual std::vector<std::string> variant_names() const = 0;
  virtual std::string variant_name(const ModelConfig& c) const = 0;
  // The published models of this family by name ("4b", "9b-kv", "zimage-turbo", "dev"), each
  // with a line for help texts ("FLUX.2-klein-9B, Qwen3-8B, about 36 GB of BF16"), and the
  // configuration of one (its real shapes: docs/MODELS.md gives the sources; throws for
  // another name). For full-size synthetic checkpoints: klein synth, the benchmarks.
  struct PublishedModel {
    std::string name, about;
  };
  virtual std::vector<PublishedModel> published_models() const = 0;
  virtual ModelConfig published_config(const std::string& name) const = 0;
  // What each of those names is and how its pipeline runs by default, for --variant's help:
  // "4b, 9b: distilled, 4 steps without guidance; ...".
  virtual std::string variants_help() const = 0;

  // For `klein inspect`: how the pipeline runs this model (one line each: guidance, caches),
  // and the transformer in a few words ("5 double + 20 single blocks, inner width 3072").
  virtual std::vector<std::string> describe_pipeline(const ModelConfig& c) const = 0;
  virtual std::string describe_transformer(const ModelConfig& c) const = 0;

  // LoRA files (weights/lora.h): the transformer weights that one module of a LoRA file
  // changes. `module` is the module as the file names it, its lora_A/lora_B/alpha suffix taken
  // off (prefixes such as "transformer." or "diffusion_model." kept); `up` is its B's shape
  // [out, r]. Each result is a canonical weight with the rows of B that update it: several
  // for a fused projection (row_begin/row_end), swap_halves where the checkpoint's halves are
  // swapped. Empty when the module names no part of this family's transformer; a name that
  // maps but is not a linear weight is refused by the caller against expected_transformer.
  virtual std::vector<TensorSource> lora_targets(const std::string& module, const Shape& up,
                                                 const std::string& where) const = 0;

  // The precision policy's built-in rules for this family's transformer (convert/policy.h):
  // what stays at a float type when the target is quantized (embedders, modulation, the
  // output layer; rows that are copied rather than multiplied). Policy lines with comments.
  virtual std::string precision_defaults() const = 0;

  // The model_index.json of a diffusers directory of this configuration, and the class name
  // of its transformer's config.json (for synthetic checkpoints: bench/support/synthetic.h).
  virtual nlohmann::json diffusers_model_index(const ModelConfig& c) const = 0;
  virtual std::string diffusers_transformer_class() const = 0;

  // The three components belong together (the transformer reads the text encoder's output
  // and the VAE's latents); the messages name the files.
  struct Files {
    std::string transformer, text_encoder, vae;
  };
  virtual void check_pairing(const ModelConfig& c, const Files& files) const = 0;
  // Whether the family's pipelines read a text encoder of this kind (Qwen3 or Mistral): a text
  // encoder opened alone (for prompt upsampling) belongs to the first family that does.
  virtual bool reads_text_encoder(const TextEncoderConfig& e) const = 0;

  // A control model of this family's pipelines (klein convert --controlnet PATH): opened from
  // its own files and checked against the model of `c` before anything is written; its units
  // and canonical names start with "controlnet.". Default: the family takes none, refused
  // naming `path`.
  virtual ExtraComponent open_control_model(const std::filesystem::path& path,
                                            const ModelConfig& c) const;
  // The unit of a canonical tensor of such a control model; nothing for other names.
  virtual std::optional<UnitOf> control_unit_of(const std::string& canonical) const {
    return std::nullopt;
  }
};

// Adds a family (src/families/registry.cpp: the built-in ones when the program starts);
// throws if one of the same id is registered. `family` must live as long as the program.
void register_model_family(const ModelFamily& family);
// Every registered family, in the order registered: a transformer file without a
// model_index.json is recognised in this order, and the first is the default. Throws when
// none is registered (a program that does not link klein_families).
const std::vector<const ModelFamily*>& model_families();
// The registered families' titles for help texts: "FLUX.2-klein, Z-Image or FLUX.2-dev".
std::string family_titles();
// The family with this id; throws naming the id and the known ones (`where`: whose id).
const ModelFamily& model_family(std::string_view id, const std::string& where = "");
inline const ModelFamily& model_family(const ModelConfig& c) { return model_family(c.family); }
// The family whose pipeline a model_index.json "_class_name" is; throws naming the file
// (`where`) and the pipelines the engine runs.
const ModelFamily& family_of_pipeline(const std::string& class_name, const std::string& where);

// The unit of any canonical tensor of a model of this family: the transformer's and a control
// model's by the family, the text encoder's and the VAE's as every family shares them, the
// safety classifier's (weights/safety_model.h) and the tiny decoder's (extra_component.h).
std::optional<UnitOf> unit_of(const ModelFamily& family, const std::string& canonical);
// Every tensor a component of this configuration must hold, with its shape.
ShapeMap expected_tensors(const ModelConfig& c, Component component);

}  // namespace klein
