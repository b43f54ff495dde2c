#pragma once
// A weight store over one component's safetensors file(s) of the tiny Z-Image model, for the
// model tests: every tensor is "<component>." + its name, grouped into units by `unit_of`
// (views into the mapping; nothing is copied).
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "weights/naming.h"
#include "weights/weight_store.h"

namespace klein::testing {

class ComponentFileStore final : public WeightStore {
 public:
  using UnitOfFn = std::function<std::optional<UnitOf>(const std::string&)>;

  // `path`: a .safetensors file or a shard index (.index.json).
  ComponentFileStore(const std::filesystem::path& path, const std::string& component,
                     const UnitOfFn& unit_of, ModelConfig config = {})
      : set_(path), config_(std::move(config)) {
    for (const SafetensorsSet::Located& t : set_.tensors()) {
      const std::string canonical = component + "." + t.entry->name;
      const std::optional<UnitOf> u = unit_of(canonical);
      if (!u) continue;  // tensors inference never reads (the text encoder's final norm, ...)
      auto& unit = units_[u->unit];
      if (!unit) unit = std::make_shared<Unit>(u->unit, u->prefix);
      const TensorView v = t.file->view(*t.entry);
      unit->put({.name = canonical,
                 .dtype = v.dtype,
                 .shape = v.shape,
                 .data = v.data,
                 .nbytes = v.nbytes});
    }
  }
  UnitRef acquire(const std::string& unit) override {
    auto it = units_.find(unit);
    if (it == units_.end()) throw Error("no unit " + unit);
    return it->second;
  }
  bool has_unit(const std::string& unit) const override { return units_.count(unit) > 0; }
  std::vector<std::string> units() const override {
    std::vector<std::string> out;
    for (const auto& [name, unit] : units_) out.push_back(name);
    return out;
  }
  const ModelConfig& config() const override { return config_; }
  std::string identity() const override { return set_.path().string(); }

 private:
  struct Unit final : WeightUnit {
    Unit(const std::string& name, const std::string& prefix) : WeightUnit(name, prefix) {}
    void put(Weight w) { add(std::move(w)); }
  };
  SafetensorsSet set_;
  ModelConfig config_;
  std::map<std::string, std::shared_ptr<Unit>> units_;
};

}  // namespace klein::testing
