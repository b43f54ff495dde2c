#pragma once
// The byte-level BPE model: vocabulary (id <-> raw bytes) and the ranked merge table.
//
// Everything is kept as raw bytes, not as the printable byte-level symbols of the files:
// a piece of text is turned into one id per byte and merged pair by pair, so encoding never
// builds or looks up strings.
//
// Loading makes about 150k inserts into each of two hash tables and 450k lookups, all at
// random places in several MiB: it is bound by memory latency, not arithmetic. So the
// tables are flat open-addressing arrays with small slots (no per-entry allocation as in
// std::unordered_map), they are built in batches that prefetch the slots a few steps
// ahead (many cache misses in flight instead of one at a time), and their memory asks for
// huge pages (a random probe then does not also miss the TLB).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace klein::tok {

void* allocate_table(size_t bytes);
void free_table(void* p, size_t bytes);

// Allocator for large random-access tables: whole 2 MiB pages flagged for transparent huge
// pages. Arrays under 2 MiB come from malloc.
template <class T>
struct TableAllocator {
  using value_type = T;
  TableAllocator() = default;
  template <class U>
  TableAllocator(const TableAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(allocate_table(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { free_table(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const TableAllocator<U>&) const { return true; }
};

template <class T>
using TableVector = std::vector<T, TableAllocator<T>>;

// Merges in rank order, as raw bytes, collected from a file before they are resolved to
// ids all at once.
class MergeList {
 public:
  void reserve(size_t merges, size_t bytes);
  void add(std::string_view left, std::string_view right);
  size_t size() const { return starts_.size(); }
  std::string_view left(size_t i) const;
  std::string_view right(size_t i) const;

 private:
  std::string bytes_;
  std::vector<uint32_t> starts_;  // where merge i's left half begins in bytes_
  std::vector<uint32_t> splits_;  // where its right half begins
};

// (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  struct Merge {
    int32_t rank = -1;  // -1: no such merge
    int32_t merged = -1;
  };

  void reserve(size_t n);
  // A pair listed twice keeps its last rank, as the reference implementations do (they build
  // a dictionary from the list in order).
  void insert(int32_t left, int32_t right, Merge m);
  void prefetch(int32_t left, int32_t right) const;
  Merge find(int32_t left, int32_t right) const;
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key = kEmpty;
    Merge value;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t key_of(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }
  void rehash(size_t capacity);

  TableVector<Slot> slots_;
  size_t size_ = 0;
};

// Token id <-> raw bytes.
class Vocabulary {
 public:
  // Sizes the storage for about `n` tokens (an estimate is fine) to avoid regrowing it.
  void reserve(size_t n);
  // Adds a token. Returns false if the id is taken already. Lookups by bytes only work
  // after build_index().
  bool add(int32_t id, std::string_view bytes);
  // Builds the bytes -> id index over everything added so far. When two ids have the same
  // bytes, lookups give the one added first.
  void build_index();

  static uint32_t hash(std::string_view a, std::string_view b = {});
  // Id of the token whose bytes are `a` followed by `b`, given hash(a, b); or -1.
  int32_t find(uint32_t hash, std::string_view a, std::string_view b = {}) const;
  int32_t find(std::string_view bytes) const { return find(hash(bytes), bytes); }
  // Lookups in a batch: prefetch_slot(h) a few steps before prefetch_entry(h), and that a
  // few steps before find(h, ...).
  void prefetch_slot(uint32_t hash) const;
  void prefetch_entry(uint32_t hash) const;

  // The bytes of a token, or nothing if the id has no entry.
  std::optional<std::string_view> bytes_of(int32_t id) const;
  size_t size() const { return count_; }

 private:
  // Each token is stored once in the arena as an entry: id (4 bytes), length (2 bytes), then
  // the bytes. A hash slot points at the entry, so a lookup touches the slot and the entry.
  static constexpr size_t kEntryHeader = 6;
  struct Slot {
    uint32_t hash = 0;
    uint32_t entry = kEmpty;  // arena offset of the entry
  };
  static constexpr uint32_t kEmpty = ~uint32_t(0);
  int32_t entry_id(uint32_t entry) const;
  std::string_view entry_bytes(uint32_t entry) const;

  TableVector<char> arena_;
  std::vector<uint32_t> entry_of_id_;  // kEmpty where an id has no token
  TableVector<Slot> slots_;
  size_t count_ = 0;
};

class BpeModel {
 public:
  void reserve_vocabulary(size_t n) { vocab_.reserve(n); }
  // Adds a vocabulary entry given as raw bytes. Returns false if the id is taken already.
  bool add_token(int32_t id, std::string_view bytes) { return vocab_.add(id, bytes); }
  // Call once the vocabulary is complete: indexes it, and fails (returns the missing byte)
  // unless every one of the 256 bytes has a token of its own.
  int finish_vocabulary();
  // Resolves merge i of the list to rank i. Returns the index of the first merge that names
  // a token (left, right, or left+right) not in the vocabulary, with that token's bytes in
  // `missing`; or -1 when all are fine.
  int64_t add_merges(const MergeList& merges, std::string* missing);

  // Working memory of encode_piece, kept by the caller across the pieces of a text so that
  // encoding a piece allocates nothing.
  struct Scratch {
    struct Symbol {
      int32_t id;
      int32_t prev;  // position of the neighbours, -1 at the ends
      int32_t next;
    };
    struct Candidate {
      int32_t rank;
      int32_t left;  // position of the left symbol
      int32_t left_id;
      int32_t right_id;
      int32_t merged;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // tokenizer.json's "ignore_merges": a piece that is a vocabulary token as a whole becomes
  // that token, without merging (Llama 3's and Tekken's tokenizers); off by default.
  void set_ignore_merges(bool on) { ignore_merges_ = on; }
  bool ignore_merges() const { return ignore_merges_; }

  // Appends the ids of one pre-tokenized piece (raw UTF-8 bytes, under 2 GiB) to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out, Scratch& scratch) const;

  int32_t id_of(std::string_view bytes) const { return vocab_.find(bytes); }
  std::optional<std::string_view> bytes_of(int32_t id) const { return vocab_.bytes_of(id); }
  size_t vocab_size() const { return vocab_.size(); }
  size_t merge_count() const { return merges_.size(); }

 private:
  Vocabulary vocab_;
  int32_t id_of_byte_[256] = {};
  MergeTable merges_;
  bool ignore_merges_ = false;
};

}  // namespace klein::tok
