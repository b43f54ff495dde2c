#pragma once
// How a store hands out a unit it keeps built, without allocating each time: the reference
// (a UnitRef) points at the store's unit object and owns a small lease whose destructor tells
// the store that the last holder is gone. The lease and its shared_ptr control block live in
// a slot inside the store's per-unit state; only one lease per unit exists at a time (a store
// hands out copies of the live one), so the slot is always free when a new one is made.
//
// The store must reset its weak_ptr to the previous lease (which frees the slot) before
// making a new one, and both happen under the store's lock.
#include <cstddef>
#include <memory>
#include <new>

#include "weights/weight_store.h"

namespace klein {

// Room for one lease with its control block.
struct LeaseSlot {
  alignas(std::max_align_t) std::byte bytes[96];
  bool used = false;
};

// An allocator that places one object in a LeaseSlot (falling back to the heap if the slot
// is taken or too small, which the stores never cause).
template <class T>
struct LeaseAllocator {
  using value_type = T;
  LeaseSlot* slot;
  explicit LeaseAllocator(LeaseSlot* s) : slot(s) {}
  template <class U>
  LeaseAllocator(const LeaseAllocator<U>& other) : slot(other.slot) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    if (!slot->used && n * sizeof(T) <= sizeof(slot->bytes) &&
        alignof(T) <= alignof(std::max_align_t)) {
      slot->used = true;
      return reinterpret_cast<T*>(slot->bytes);
    }
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t) {
    if (reinterpret_cast<std::byte*>(p) == slot->bytes) {
      slot->used = false;
      return;
    }
    ::operator delete(p);
  }
  template <class U>
  bool operator==(const LeaseAllocator<U>& other) const {
    return slot == other.slot;
  }
};

// A reference to `unit` whose last copy going calls on_gone().
template <class OnGone>
UnitRef lease_unit(const WeightUnit* unit, LeaseSlot* slot, OnGone on_gone) {
  struct Lease {
    explicit Lease(OnGone f) : on_gone(std::move(f)) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { on_gone(); }
    OnGone on_gone;
  };
  auto lease = std::allocate_shared<Lease>(LeaseAllocator<Lease>(slot), std::move(on_gone));
  return UnitRef(std::move(lease), unit);
}

}  // namespace klein
