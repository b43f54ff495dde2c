#include "tokenizer/bpe.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace klein::tok {

namespace {

// splitmix64 finaliser: the pair keys are small dense ids and would cluster without it.
uint64_t mix(uint64_t key) {
  key ^= key >> 30;
  key *= 0xbf58476d1ce4e5b9ULL;
  key ^= key >> 27;
  key *= 0x94d049bb133111ebULL;
  key ^= key >> 31;
  return key;
}

// Power-of-two capacity for n entries at a load factor of at most 3/4. Linear probing stays
// short at that load, and a smaller table misses the cache less than a sparser one.
size_t capacity_for(size_t n) {
  size_t capacity = 16;
  while (capacity * 3 < n * 4) capacity *= 2;
  return capacity;
}

constexpr size_t kHugePage = size_t(2) << 20;

// How many steps ahead batched table operations prefetch: enough misses in flight to hide
// memory latency, few enough that the prefetched lines are still in L1 when used.
constexpr size_t kAhead = 16;

void prefetch_line(const void* p) { __builtin_prefetch(p, 0, 3); }

}  // namespace

// ---------------------------------------------------------------------------------------
// Table memory

void* allocate_table(size_t bytes) {
  if (bytes < kHugePage) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  // Only a hint: without transparent huge pages the tables work the same, just slower.
  ::madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

void free_table(void* p, size_t) { std::free(p); }

// ---------------------------------------------------------------------------------------
// MergeList

void MergeList::reserve(size_t merges, size_t bytes) {
  starts_.reserve(merges);
  splits_.reserve(merges);
  bytes_.reserve(bytes);
}

void MergeList::add(std::string_view left, std::string_view right) {
  check(bytes_.size() + left.size() + right.size() < UINT32_MAX,
        "the merge list is larger than 4 GiB");
  starts_.push_back(uint32_t(bytes_.size()));
  bytes_.append(left);
  splits_.push_back(uint32_t(bytes_.size()));
  bytes_.append(right);
}

std::string_view MergeList::left(size_t i) const {
  return std::string_view(bytes_).substr(starts_[i], splits_[i] - starts_[i]);
}

std::string_view MergeList::right(size_t i) const {
  const size_t end = i + 1 < starts_.size() ? starts_[i + 1] : bytes_.size();
  return std::string_view(bytes_).substr(splits_[i], end - splits_[i]);
}

// ---------------------------------------------------------------------------------------
// MergeTable

void MergeTable::reserve(size_t n) {
  if (capacity_for(n) > slots_.size()) rehash(capacity_for(n));
}

void MergeTable::rehash(size_t capacity) {
  TableVector<Slot> old = std::move(slots_);
  slots_ = TableVector<Slot>(capacity);
  size_ = 0;
  for (const Slot& s : old)
    if (s.key != kEmpty) insert(int32_t(s.key >> 32), int32_t(uint32_t(s.key)), s.value);
}

void MergeTable::insert(int32_t left, int32_t right, Merge m) {
  if (4 * (size_ + 1) > 3 * slots_.size()) rehash(capacity_for(size_ + 1));
  const uint64_t key = key_of(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.value = m;
      return;
    }
    if (s.key == kEmpty) {
      s.key = key;
      s.value = m;
      ++size_;
      return;
    }
  }
}

void MergeTable::prefetch(int32_t left, int32_t right) const {
  if (!slots_.empty()) prefetch_line(&slots_[mix(key_of(left, right)) & (slots_.size() - 1)]);
}

MergeTable::Merge MergeTable::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return {};
  const uint64_t key = key_of(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.key == key) return s.value;
    if (s.key == kEmpty) return {};
  }
}

// ---------------------------------------------------------------------------------------
// Vocabulary

uint32_t Vocabulary::hash(std::string_view a, std::string_view b) {
  // FNV-1a over a then b: tokens are short (6.4 bytes on average), where this byte loop is
  // as fast as anything, and it hashes a concatenation without building it.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : a) h = (h ^ uint8_t(c)) * 0x100000001b3ULL;
  for (char c : b) h = (h ^ uint8_t(c)) * 0x100000001b3ULL;
  return uint32_t(mix(h));
}

int32_t Vocabulary::entry_id(uint32_t entry) const {
  int32_t id;
  std::memcpy(&id, arena_.data() + entry, sizeof id);
  return id;
}

std::string_view Vocabulary::entry_bytes(uint32_t entry) const {
  uint16_t length;
  std::memcpy(&length, arena_.data() + entry + 4, sizeof length);
  return std::string_view(arena_.data() + entry + kEntryHeader, length);
}

void Vocabulary::reserve(size_t n) {
  // 16 bytes per entry covers the 6-byte header plus the average token with room to spare.
  arena_.reserve(n * 16);
  entry_of_id_.reserve(n);
}

bool Vocabulary::add(int32_t id, std::string_view bytes) {
  if (size_t(id) >= entry_of_id_.size()) entry_of_id_.resize(size_t(id) + 1, kEmpty);
  if (entry_of_id_[size_t(id)] != kEmpty) return false;
  check(bytes.size() <= UINT16_MAX, "token ", id, " is ", bytes.size(),
        " bytes long; the limit is ", UINT16_MAX);
  check(arena_.size() + kEntryHeader + bytes.size() < kEmpty,
        "the vocabulary is larger than 4 GiB");
  const uint16_t length = uint16_t(bytes.size());
  char header[kEntryHeader];
  std::memcpy(header, &id, 4);
  std::memcpy(header + 4, &length, 2);
  entry_of_id_[size_t(id)] = uint32_t(arena_.size());
  arena_.insert(arena_.end(), header, header + kEntryHeader);
  arena_.insert(arena_.end(), bytes.begin(), bytes.end());
  ++count_;
  return true;
}

void Vocabulary::build_index() {
  // Entries in arena order, i.e. in the order they were added, so "first added wins".
  std::vector<uint32_t> entries, hashes;
  entries.reserve(count_);
  hashes.reserve(count_);
  for (size_t e = 0; e < arena_.size(); e += kEntryHeader + entry_bytes(uint32_t(e)).size()) {
    entries.push_back(uint32_t(e));
    hashes.push_back(hash(entry_bytes(uint32_t(e))));
  }
  slots_ = TableVector<Slot>(capacity_for(entries.size()));
  const size_t mask = slots_.size() - 1;
  for (size_t k = 0; k < entries.size(); ++k) {
    if (k + kAhead < entries.size()) prefetch_line(&slots_[hashes[k + kAhead] & mask]);
    const std::string_view bytes = entry_bytes(entries[k]);
    size_t i = hashes[k] & mask;
    bool duplicate = false;
    for (; slots_[i].entry != kEmpty && !duplicate; i = (i + 1) & mask)
      duplicate = slots_[i].hash == hashes[k] && entry_bytes(slots_[i].entry) == bytes;
    if (!duplicate) slots_[i] = {hashes[k], entries[k]};
  }
}

void Vocabulary::prefetch_slot(uint32_t hash) const {
  if (!slots_.empty()) prefetch_line(&slots_[hash & (slots_.size() - 1)]);
}

void Vocabulary::prefetch_entry(uint32_t hash) const {
  if (slots_.empty()) return;
  const Slot& s = slots_[hash & (slots_.size() - 1)];
  if (s.entry != kEmpty) prefetch_line(arena_.data() + s.entry);
}

int32_t Vocabulary::find(uint32_t hash, std::string_view a, std::string_view b) const {
  if (slots_.empty()) return -1;
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask; slots_[i].entry != kEmpty; i = (i + 1) & mask) {
    if (slots_[i].hash != hash) continue;
    const std::string_view t = entry_bytes(slots_[i].entry);
    if (t.size() == a.size() + b.size() && t.starts_with(a) && t.ends_with(b))
      return entry_id(slots_[i].entry);
  }
  return -1;
}

std::optional<std::string_view> Vocabulary::bytes_of(int32_t id) const {
  if (id < 0 || size_t(id) >= entry_of_id_.size() || entry_of_id_[size_t(id)] == kEmpty)
    return std::nullopt;
  return entry_bytes(entry_of_id_[size_t(id)]);
}

// ---------------------------------------------------------------------------------------
// BpeModel

int BpeModel::finish_vocabulary() {
  vocab_.build_index();
  for (int b = 0; b < 256; ++b) {
    const char byte = char(b);
    const int32_t id = vocab_.find(std::string_view(&byte, 1));
    if (id < 0) return b;
    id_of_byte_[b] = id;
  }
  return -1;
}

int64_t BpeModel::add_merges(const MergeList& list, std::string* missing) {
  const size_t n = list.size();
  // Pass 1: hash the three tokens of every merge (sequential, no misses).
  struct Hashes {
    uint32_t left, right, joined;
  };
  std::vector<Hashes> hashes(n);
  for (size_t i = 0; i < n; ++i)
    hashes[i] = {Vocabulary::hash(list.left(i)), Vocabulary::hash(list.right(i)),
                 Vocabulary::hash(list.left(i), list.right(i))};

  // Pass 2: look the tokens up, the slots prefetched two batches ahead and the entries
  // they point to one batch ahead.
  struct Ids {
    int32_t left, right, joined;
  };
  std::vector<Ids> ids(n);
  auto prefetch_slots = [&](const Hashes& h) {
    vocab_.prefetch_slot(h.left), vocab_.prefetch_slot(h.right), vocab_.prefetch_slot(h.joined);
  };
  auto prefetch_entries = [&](const Hashes& h) {
    vocab_.prefetch_entry(h.left), vocab_.prefetch_entry(h.right), vocab_.prefetch_entry(h.joined);
  };
  for (size_t i = 0; i < n; ++i) {
    if (i + 2 * kAhead < n) prefetch_slots(hashes[i + 2 * kAhead]);
    if (i + kAhead < n) prefetch_entries(hashes[i + kAhead]);
    const std::string_view left = list.left(i), right = list.right(i);
    ids[i] = {vocab_.find(hashes[i].left, left), vocab_.find(hashes[i].right, right),
              vocab_.find(hashes[i].joined, left, right)};
    if (ids[i].left < 0 || ids[i].right < 0 || ids[i].joined < 0) {
      *missing = ids[i].left < 0    ? std::string(left)
                 : ids[i].right < 0 ? std::string(right)
                                    : std::string(left) + std::string(right);
      return int64_t(i);
    }
  }

  // Pass 3: fill the merge table, again prefetching ahead.
  merges_.reserve(merges_.size() + n);
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) merges_.prefetch(ids[i + kAhead].left, ids[i + kAhead].right);
    merges_.insert(ids[i].left, ids[i].right, {int32_t(i), ids[i].joined});
  }
  return -1;
}

// ---------------------------------------------------------------------------------------
// Encoding one piece

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out,
                            Scratch& scratch) const {
  const size_t n = piece.size();
  if (n == 0) return;
  if (n == 1) {
    out.push_back(id_of_byte_[uint8_t(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    const int32_t whole = vocab_.find(piece);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }

  // The symbols form a linked list over the bytes of the piece; merging joins a symbol with
  // its right neighbour, which leaves the list. A heap holds every adjacent pair that has a
  // merge, lowest rank first and leftmost first among equal ranks, so applying the pairs in
  // heap order repeats "merge every occurrence of the best pair, left to right". Entries go
  // stale when a neighbour changes; they are recognised by the ids they were made from.
  auto& symbols = scratch.symbols;
  auto& heap = scratch.heap;
  symbols.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i)
    symbols[i] = {id_of_byte_[uint8_t(piece[i])], int32_t(i) - 1, i + 1 < n ? int32_t(i + 1) : -1};

  auto consider = [&](int32_t left) {
    const int32_t right = symbols[size_t(left)].next;
    if (right < 0) return;
    const int32_t a = symbols[size_t(left)].id, b = symbols[size_t(right)].id;
    const MergeTable::Merge m = merges_.find(a, b);
    if (m.rank < 0) return;
    heap.push_back({m.rank, left, a, b, m.merged});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(int32_t(i));

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Scratch::Candidate c = heap.back();
    heap.pop_back();
    Scratch::Symbol& left = symbols[size_t(c.left)];
    if (left.id != c.left_id || left.next < 0) continue;  // left changed or was absorbed
    Scratch::Symbol& right = symbols[size_t(left.next)];
    if (right.id != c.right_id) continue;  // right neighbour changed
    left.id = c.merged;
    right.id = -1;
    left.next = right.next;
    if (left.next >= 0) symbols[size_t(left.next)].prev = c.left;
    if (left.prev >= 0) consider(left.prev);
    consider(c.left);
  }

  for (int32_t i = 0; i >= 0; i = symbols[size_t(i)].next) out.push_back(symbols[size_t(i)].id);
}

}  // namespace klein::tok
