#pragma once
// A WeightStore that reads straight from the published safetensors files: tensors are views
// into the mapped files (zero copy), except the few that a layout change forces us to
// rebuild (BFL's swapped final-layer halves).
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "formats/safetensors.h"
#include "weights/naming.h"
#include "weights/weight_store.h"

namespace klein {

struct SourceComponent {
  Component component;
  Layout layout = Layout::Diffusers;
  std::filesystem::path config_file;  // its config.json; empty when read from tensor shapes
  std::unique_ptr<SafetensorsSet> files;
  std::vector<TensorSource> tensors;  // canonical name -> where its bytes are
};

class SourceStore final : public WeightStore {
 public:
  SourceStore(std::vector<SourceComponent> components, ModelConfig config, std::string identity);

  UnitRef acquire(const std::string& unit) override;
  bool has_unit(const std::string& unit) const override { return units_.count(unit) > 0; }
  std::vector<std::string> units() const override;
  const ModelConfig& config() const override { return config_; }
  std::string identity() const override { return identity_; }

  const std::vector<SourceComponent>& components() const { return components_; }

 private:
  struct Pending {
    const SourceComponent* component;
    const TensorSource* source;
  };
  std::vector<SourceComponent> components_;
  ModelConfig config_;
  std::string identity_;
  std::map<std::string, std::vector<Pending>> units_;  // unit -> its tensors
  std::map<std::string, std::string> prefixes_;        // unit -> name prefix
  std::mutex mutex_;
  std::map<std::string, std::weak_ptr<const WeightUnit>> live_;
};

}  // namespace klein
