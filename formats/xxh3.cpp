// XXH3 for the baseline instruction set, and the choice of implementation (formats/xxh3.h).
#include "formats/xxh3.h"

#include "core/cpu.h"
#include "formats/xxh3_impl.inc"

namespace klein::xxh3 {
namespace detail {

const Functions& baseline() {
  static const Functions f{"baseline", hash, create, destroy, reset, update, digest};
  return f;
}

}  // namespace detail

namespace {

const detail::Functions& chosen() {
  static const detail::Functions& f = []() -> const detail::Functions& {
#if defined(KLEIN_X86)
    const CpuFeatures& cpu = cpu_features();
    if (cpu.avx512) return detail::avx512();
    if (cpu.avx2) return detail::avx2();
#endif
    return detail::baseline();
  }();
  return f;
}

}  // namespace

uint64_t hash64(const void* data, size_t n) { return chosen().hash(data, n); }

Hasher::Hasher() : state_(chosen().create()) {}
Hasher::~Hasher() = default;

void Hasher::Free::operator()(void* state) const { chosen().destroy(state); }

void Hasher::reset() { chosen().reset(state_.get()); }

void Hasher::update(const void* data, size_t n) { chosen().update(state_.get(), data, n); }

uint64_t Hasher::digest() const { return chosen().digest(state_.get()); }

std::string_view implementation() { return chosen().name; }

}  // namespace klein::xxh3
