#include "convert/report/mixed_store.h"

#include "core/error.h"

namespace klein::report {

MixedStore::MixedStore(WeightStore& reference, WeightStore& candidate,
                       std::set<std::string> from_candidate)
    : reference_(reference), candidate_(candidate), from_candidate_(std::move(from_candidate)) {
  for (const auto& u : from_candidate_)
    check(candidate_.has_unit(u), "the candidate has no unit ", u);
}

std::string MixedStore::identity() const {
  std::string id = "mixed:" + reference_.identity() + "|" + candidate_.identity() + "|";
  for (const auto& u : from_candidate_) id += u + ",";
  return id;
}

}  // namespace klein::report
