#pragma once
// A WeightStore over one network that is not part of a model (the safety classifier, a control
// model, the tiny decoder): every tensor is `prefix` + its name, grouped into units by
// `unit_of` (tensors it places in no unit are left out); a unit is views, nothing copied: into
// the mapped safetensors files (the pages come in as the layers read them), or into float32
// tensors the store holds in memory (a network read from a format no store maps: the tiny
// decoder's .pth).
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/safetensors.h"
#include "weights/naming.h"
#include "weights/weight_store.h"

namespace klein {

class ComponentStore final : public WeightStore {
 public:
  using UnitOfFn = std::function<std::optional<UnitOf>(const std::string&)>;
  // Float32 tensors by name: shape and values.
  using Tensors = std::map<std::string, std::pair<Shape, std::vector<float>>>;
  // `name` is the store's config().name; `what` names the network in errors ("the safety
  // classifier").
  ComponentStore(std::unique_ptr<SafetensorsSet> files, const std::string& prefix,
                 const UnitOfFn& unit_of, std::string name, std::string what);
  // Over tensors held in memory, read from `files` (recorded by the converter).
  ComponentStore(Tensors tensors, const std::string& prefix, const UnitOfFn& unit_of,
                 std::vector<std::filesystem::path> files, std::string name, std::string what);

  UnitRef acquire(const std::string& unit) override;
  bool has_unit(const std::string& unit) const override { return units_.count(unit) > 0; }
  std::vector<std::string> units() const override;
  const ModelConfig& config() const override { return config_; }
  std::string identity() const override { return identity_; }
  uint64_t unit_bytes(const std::string& unit) const override;
  StoreOrigin origin() const override;

 private:
  void add(const std::string& canonical, Weight w, const UnitOfFn& unit_of);

  std::unique_ptr<SafetensorsSet> files_;  // null for tensors held in memory
  Tensors tensors_;
  std::vector<std::filesystem::path> paths_;
  ModelConfig config_;
  std::string what_, identity_;
  std::map<std::string, std::vector<Weight>> units_;
  std::map<std::string, std::string> prefixes_;
};

}  // namespace klein
