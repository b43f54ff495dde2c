#pragma once
// A WeightStore over one network's safetensors file(s) that is not part of a model (the safety
// classifier, a control model): every tensor is `prefix` + its name, grouped into units by
// `unit_of` (tensors it places in no unit are left out); a unit is views into the mapped files,
// nothing copied, the pages come in as the layers read them.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "weights/naming.h"
#include "weights/weight_store.h"

namespace klein {

class ComponentStore final : public WeightStore {
 public:
  using UnitOfFn = std::function<std::optional<UnitOf>(const std::string&)>;
  // `name` is the store's config().name; `what` names the network in errors ("the safety
  // classifier").
  ComponentStore(std::unique_ptr<SafetensorsSet> files, const std::string& prefix,
                 const UnitOfFn& unit_of, std::string name, std::string what);

  UnitRef acquire(const std::string& unit) override;
  bool has_unit(const std::string& unit) const override { return units_.count(unit) > 0; }
  std::vector<std::string> units() const override;
  const ModelConfig& config() const override { return config_; }
  std::string identity() const override { return identity_; }
  uint64_t unit_bytes(const std::string& unit) const override;
  StoreOrigin origin() const override;

 private:
  std::unique_ptr<SafetensorsSet> files_;
  ModelConfig config_;
  std::string what_, identity_;
  std::map<std::string, std::vector<Weight>> units_;
  std::map<std::string, std::string> prefixes_;
};

}  // namespace klein
