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
    const TensorView v = t.file->view(*t.entry);
    Weight w;
    w.dtype = v.dtype;
    w.shape = v.shape;
    w.data = v.data;
    w.nbytes = v.nbytes;
    add(prefix + t.entry->name, std::move(w), unit_of);
  }
  for (const auto& f : files_->files()) paths_.push_back(f->path());
  for (const auto& p : paths_) identity_ += file_identity(p) + ";";
}

ComponentStore::ComponentStore(Tensors tensors, const std::string& prefix, const UnitOfFn& unit_of,
                               std::vector<std::filesystem::path> files, std::string name,
                               std::string what)
    : tensors_(std::move(tensors)), paths_(std::move(files)), what_(std::move(what)) {
  config_.name = std::move(name);
  for (const auto& [relative, tensor] : tensors_) {
    const auto& [shape, values] = tensor;
    check(int64_t(values.size()) == numel(shape), what_, ": tensor ", relative, " ",
          shape_str(shape), " holds ", values.size(), " values");
    Weight w;
    w.dtype = DType::F32;
    w.shape = shape;
    w.data = values.data();
    w.nbytes = values.size() * sizeof(float);
    add(prefix + relative, std::move(w), unit_of);
  }
  for (const auto& p : paths_) identity_ += file_identity(p) + ";";
}

void ComponentStore::add(const std::string& canonical, Weight w, const UnitOfFn& unit_of) {
  const std::optional<UnitOf> u = unit_of(canonical);
  if (!u) return;
  w.name = canonical;
  units_[u->unit].push_back(std::move(w));
  prefixes_[u->unit] = u->prefix;
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
  o.files = paths_;
  if (files_)
    for (const auto& f : files_->files()) o.mappings.emplace_back(f->mapping().data(), f->mapping().size());
  return o;
}

}  // namespace klein
