#pragma once
// A model made of two: every unit from the reference except the chosen ones, which come from
// the candidate. Running it shows what quantizing just those units does, on exactly the
// activations the reference produces everywhere else; the report measures each block's own
// error that way.
#include <set>
#include <string>
#include <vector>

#include "weights/weight_store.h"

namespace klein::report {

class MixedStore final : public WeightStore {
 public:
  // Both stores must outlive this one; every name in `from_candidate` must be a unit of the
  // candidate.
  MixedStore(WeightStore& reference, WeightStore& candidate, std::set<std::string> from_candidate);

  UnitRef acquire(const std::string& unit) override { return source(unit).acquire(unit); }
  void prefetch(const std::string& unit) override { source(unit).prefetch(unit); }
  bool has_unit(const std::string& unit) const override { return reference_.has_unit(unit); }
  std::vector<std::string> units() const override { return reference_.units(); }
  const ModelConfig& config() const override { return reference_.config(); }
  std::string identity() const override;

 private:
  WeightStore& source(const std::string& unit) {
    return from_candidate_.count(unit) ? candidate_ : reference_;
  }

  WeightStore& reference_;
  WeightStore& candidate_;
  std::set<std::string> from_candidate_;
};

}  // namespace klein::report
