#include "ops/compute.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#include "core/error.h"
#include "core/tensor.h"

namespace klein {

namespace {

constexpr size_t kMinBlock = size_t(1) << 20;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

Arena::~Arena() {
  for (Block& b : blocks_) std::free(b.data);
}

size_t Arena::capacity() const {
  size_t total = 0;
  for (const Block& b : blocks_) total += b.size;
  return total;
}

void Arena::add_block(size_t bytes) {
  Block b;
  b.size = aligned(bytes);
  b.data = static_cast<std::byte*>(std::aligned_alloc(kAlign, b.size));
  if (!b.data) throw std::bad_alloc();
  blocks_.push_back(b);
}

void Arena::reserve(size_t bytes) {
  if (depth_ == 0 && capacity() < bytes) {
    merge_blocks();
    if (capacity() < bytes) {
      for (Block& b : blocks_) std::free(b.data);
      blocks_.clear();
      add_block(bytes);
    }
  }
}

// With nothing in use, several blocks become one of their total size (one allocation now,
// none the next time the same sequence of takes runs).
void Arena::merge_blocks() {
  if (blocks_.size() <= 1) return;
  const size_t total = capacity();
  for (Block& b : blocks_) std::free(b.data);
  blocks_.clear();
  add_block(total);
  current_ = 0;
}

void* Arena::take_bytes(size_t bytes) {
  check(depth_ > 0, "arena: memory taken outside a scope");
  bytes = aligned(std::max<size_t>(bytes, 1));
  // Blocks after the current one are empty (stack order): use the first that fits.
  while (current_ < blocks_.size() && blocks_[current_].size - blocks_[current_].used < bytes) {
    if (current_ + 1 == blocks_.size()) break;
    ++current_;
  }
  if (blocks_.empty() || blocks_[current_].size - blocks_[current_].used < bytes) {
    add_block(std::max({bytes, kMinBlock, capacity()}));
    current_ = blocks_.size() - 1;
  }
  Block& b = blocks_[current_];
  void* p = b.data + b.used;
  b.used += bytes;
  in_use_ += bytes;
  high_water_ = std::max(high_water_, in_use_);
  return p;
}

Arena::Scope::Scope(Arena& arena)
    : arena_(arena),
      block_(arena.current_),
      used_(arena.blocks_.empty() ? 0 : arena.blocks_[arena.current_].used),
      in_use_(arena.in_use_) {
  ++arena_.depth_;
}

Arena::Scope::~Scope() {
  Arena& a = arena_;
  for (size_t i = block_ + 1; i < a.blocks_.size(); ++i) a.blocks_[i].used = 0;
  if (!a.blocks_.empty()) a.blocks_[block_].used = used_;
  a.current_ = block_;
  a.in_use_ = in_use_;
  if (--a.depth_ == 0) a.merge_blocks();
}

void Compute::level_arenas() {
  size_t most = 0;
  for (const auto& a : arenas_) most = std::max(most, a->high_water());
  for (const auto& a : arenas_) a->reserve(most);
}

Compute::Compute(int threads, quant::Isa isa)
    : pool_(threads), isa_(isa == quant::Isa::Auto ? quant::best_isa() : isa) {
  check(quant::isa_available(isa_), "instruction set ", quant::isa_name(isa_),
        " is not available on this CPU or build");
  for (int i = 0; i < pool_.size(); ++i) arenas_.push_back(std::make_unique<Arena>());
}

quant::MatmulOptions Compute::matmul_options() {
  quant::MatmulOptions o;
  o.isa = isa_;
  o.scratch = &matmul_scratch_;
  o.float_on_tiles = arithmetic.float_on_tiles;
  return o;
}

}  // namespace klein
