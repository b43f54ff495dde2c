#include "weights/component_store.h"

#include "core/error.h"
#include "core/files.h"

namespace klein {

namespace {

class Unit final : public WeightUnit {
 public:
  Unit(std::string name, std::string prefix) : WeightUnit(std::move(name), std::move(prefix)) {}
  using WeightUnit::add;
};

}  // namespace

ComponentStore::ComponentStore(std::unique_ptr<SafetensorsSet> files, const std::string& prefix,
                               const UnitOfFn& unit_of, std::string name, std::string what)
    : files_(std::move(files)), what_(std::move(what)) {
  config_.name = std::move(name);
  for (const auto& t : files_->tensors()) {
    const std::string canonical = prefix + t.entry->name;
    const std::optional<UnitOf> u = unit_of(canonical);
    if (!u) continue;
    const TensorView v = t.file->view(*t.entry);
    Weight w;
    w.name = canonical;
    w.dtype = v.dtype;
    w.shape = v.shape;
    w.data = v.data;
    w.nbytes = v.nbytes;
    units_[u->unit].push_back(std::move(w));
    prefixes_[u->unit] = u->prefix;
  }
  for (const auto& f : files_->files()) identity_ += file_identity(f->path()) + ";";
}

UnitRef ComponentStore::acquire(const std::string& unit) {
  auto it = units_.find(unit);
  check(it != units_.end(), what_, " has no weight unit ", unit);
  auto u = std::make_shared<Unit>(unit, prefixes_.at(unit));
  for (const Weight& w : it->second) u->add(w);
  return u;
}

std::vector<std::string> ComponentStore::units() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : units_) out.push_back(name);
  return out;
}

uint64_t ComponentStore::unit_bytes(const std::string& unit) const {
  uint64_t n = 0;
  if (auto it = units_.find(unit); it != units_.end())
    for (const Weight& w : it->second) n += w.nbytes;
  return n;
}

StoreOrigin ComponentStore::origin() const {
  StoreOrigin o;
  for (const auto& f : files_->files()) {
    o.files.push_back(f->path());
    o.mappings.emplace_back(f->mapping().data(), f->mapping().size());
  }
  return o;
}

}  // namespace klein
