#include "formats/torch_pickle.h"

#include <cstring>
#include <set>
#include <unordered_map>

#include "core/error.h"

namespace klein {

namespace {

// Bounds: a state dict of thousands of tensors has a pickle of a few MiB and a few hundred
// thousand values; these are far above that and far below what would exhaust memory.
constexpr size_t kMaxPickleBytes = size_t(64) << 20;
constexpr size_t kMaxValues = size_t(1) << 22;
// Tuple items, dict entries and memo entries together.
constexpr size_t kMaxReferences = size_t(1) << 24;
constexpr size_t kMaxStack = size_t(1) << 20;
constexpr uint32_t kMaxMemoIndex = uint32_t(1) << 24;
constexpr size_t kMaxGlobalLine = 256;
constexpr size_t kMaxDims = 8;
constexpr uint64_t kMaxDim = uint64_t(1) << 40;
constexpr uint64_t kMaxElements = uint64_t(1) << 50;

// The names of every opcode up to protocol 5, so that a refusal says which one it met.
const char* opcode_name(uint8_t op) {
  switch (op) {
    case 0x28: return "MARK";
    case 0x2e: return "STOP";
    case 0x30: return "POP";
    case 0x31: return "POP_MARK";
    case 0x32: return "DUP";
    case 0x46: return "FLOAT";
    case 0x49: return "INT";
    case 0x4a: return "BININT";
    case 0x4b: return "BININT1";
    case 0x4c: return "LONG";
    case 0x4d: return "BININT2";
    case 0x4e: return "NONE";
    case 0x50: return "PERSID";
    case 0x51: return "BINPERSID";
    case 0x52: return "REDUCE";
    case 0x53: return "STRING";
    case 0x54: return "BINSTRING";
    case 0x55: return "SHORT_BINSTRING";
    case 0x56: return "UNICODE";
    case 0x58: return "BINUNICODE";
    case 0x61: return "APPEND";
    case 0x62: return "BUILD";
    case 0x63: return "GLOBAL";
    case 0x64: return "DICT";
    case 0x7d: return "EMPTY_DICT";
    case 0x65: return "APPENDS";
    case 0x67: return "GET";
    case 0x68: return "BINGET";
    case 0x69: return "INST";
    case 0x6a: return "LONG_BINGET";
    case 0x6c: return "LIST";
    case 0x5d: return "EMPTY_LIST";
    case 0x6f: return "OBJ";
    case 0x70: return "PUT";
    case 0x71: return "BINPUT";
    case 0x72: return "LONG_BINPUT";
    case 0x73: return "SETITEM";
    case 0x74: return "TUPLE";
    case 0x29: return "EMPTY_TUPLE";
    case 0x75: return "SETITEMS";
    case 0x47: return "BINFLOAT";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 0x42: return "BINBYTES";
    case 0x43: return "SHORT_BINBYTES";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

std::string describe_opcode(uint8_t op) {
  std::ostringstream s;
  const char* name = opcode_name(op);
  s << (name ? name : "unknown opcode") << " (0x" << std::hex << int(op) << ")";
  return s.str();
}

enum class Kind { None, Bool, Int, String, Tuple, Dict, Global, Storage, Tensor };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "a bool";
    case Kind::Int: return "an int";
    case Kind::String: return "a string";
    case Kind::Tuple: return "a tuple";
    case Kind::Dict: return "a dict";
    case Kind::Global: return "a class or function";
    case Kind::Storage: return "a storage";
    case Kind::Tensor: return "a tensor";
  }
  return "?";
}

// The globals a state dict may name; anything else is refused when GLOBAL reads it.
enum class Callable { OrderedDict, RebuildTensor, StorageClass };

struct Value {
  Kind kind = Kind::None;
  int64_t number = 0;          // Int, Bool
  std::string text;            // String; Global: "module.name"; Storage: its key
  std::vector<int32_t> items;  // Tuple
  std::vector<std::pair<int32_t, int32_t>> entries;  // Dict
  Callable callable = Callable::OrderedDict;         // Global
  DType dtype = DType::F32;                          // Global StorageClass, Storage, Tensor
  uint64_t numel = 0;                                // Storage
  int32_t tensor = -1;                               // Tensor: index into the records
};

bool storage_dtype(const std::string& name, DType& dtype) {
  static const std::pair<const char*, DType> kinds[] = {
      {"FloatStorage", DType::F32}, {"HalfStorage", DType::F16}, {"BFloat16Storage", DType::BF16},
      {"LongStorage", DType::I64},  {"IntStorage", DType::I32},  {"ByteStorage", DType::U8}};
  for (const auto& [n, d] : kinds)
    if (name == n) {
      dtype = d;
      return true;
    }
  return false;
}

class Machine {
 public:
  Machine(std::span<const std::byte> pickle, const std::string& where)
      : p_(reinterpret_cast<const uint8_t*>(pickle.data())), size_(pickle.size()), where_(where) {
    check(size_ <= kMaxPickleBytes, where_, ": data.pkl of ", size_, " bytes is larger than the ",
          kMaxPickleBytes, " bytes a state dict's pickle may have");
  }

  std::vector<TorchTensorRecord> run() {
    while (true) {
      check(pos_ < size_, where_, ": data.pkl ends at byte ", size_,
            " without a STOP opcode (truncated?)");
      op_at_ = pos_;
      const uint8_t op = p_[pos_++];
      switch (op) {
        case 0x80: {  // PROTO
          const uint8_t v = u8();
          check(v >= 2 && v <= 2, where_, ": data.pkl is pickle protocol ", int(v),
                "; torch.save writes protocol 2, the only one read here");
          break;
        }
        case 0x2e:  // STOP
          return finish();
        case 0x28:  // MARK
          check(marks_.size() < kMaxStack, where_, ": data.pkl nests too many MARKs");
          marks_.push_back(stack_.size());
          break;
        case 0x4e: push(make(Kind::None)); break;  // NONE
        case 0x88:                                 // NEWTRUE
        case 0x89: {                               // NEWFALSE
          const int32_t v = make(Kind::Bool);
          values_[size_t(v)].number = op == 0x88;
          push(v);
          break;
        }
        case 0x4b: push_int(u8()); break;        // BININT1
        case 0x4d: push_int(uint_le(2)); break;  // BININT2
        case 0x4a: {                             // BININT
          const uint32_t u = uint32_t(uint_le(4));
          push_int(int32_t(u));
          break;
        }
        case 0x8a: {  // LONG1: n bytes, little-endian two's complement
          const uint8_t n = u8();
          check(n <= 8, where_, ": LONG1 of ", int(n), " bytes at byte ", op_at_,
                " (more than 64 bits)");
          uint64_t u = uint_le(n);
          if (n > 0 && n < 8 && (u >> (8 * n - 1)) & 1) u |= ~uint64_t(0) << (8 * n);
          push_int(int64_t(u));
          break;
        }
        case 0x58: {  // BINUNICODE
          const uint64_t n = uint_le(4);
          need(n);
          const int32_t v = make(Kind::String);
          values_[size_t(v)].text.assign(reinterpret_cast<const char*>(p_ + pos_), size_t(n));
          pos_ += n;
          push(v);
          break;
        }
        case 0x29: push(make(Kind::Tuple)); break;  // EMPTY_TUPLE
        case 0x85: tuple_of(1); break;              // TUPLE1
        case 0x86: tuple_of(2); break;              // TUPLE2
        case 0x87: tuple_of(3); break;              // TUPLE3
        case 0x74: {                                // TUPLE
          const size_t base = pop_mark();
          tuple_of(stack_.size() - base);
          break;
        }
        case 0x7d: push(make(Kind::Dict)); break;  // EMPTY_DICT
        case 0x73: {                               // SETITEM
          check(stack_.size() >= 3, where_, ": SETITEM at byte ", op_at_, " on a short stack");
          const int32_t value = pop(), key = pop();
          refer(1);
          dict_at(stack_.back()).entries.emplace_back(key, value);
          break;
        }
        case 0x75: {  // SETITEMS
          const size_t base = pop_mark();
          check((stack_.size() - base) % 2 == 0, where_, ": SETITEMS at byte ", op_at_,
                " with an odd number of values");
          check(base >= 1, where_, ": SETITEMS at byte ", op_at_, " without a dict");
          refer((stack_.size() - base) / 2);
          Value& dict = dict_at(stack_[base - 1]);
          for (size_t i = base; i < stack_.size(); i += 2)
            dict.entries.emplace_back(stack_[i], stack_[i + 1]);
          stack_.resize(base);
          break;
        }
        case 0x71: put(u8()); break;                  // BINPUT
        case 0x72: put(uint32_t(uint_le(4))); break;  // LONG_BINPUT
        case 0x68: get(u8()); break;                  // BINGET
        case 0x6a: get(uint32_t(uint_le(4))); break;  // LONG_BINGET
        case 0x63: global(); break;                   // GLOBAL
        case 0x51: persistent_id(); break;            // BINPERSID
        case 0x52: reduce(); break;                   // REDUCE
        case 0x62: {                                  // BUILD
          check(stack_.size() >= 2, where_, ": BUILD at byte ", op_at_, " on a short stack");
          pop();  // the state: the state dict's _metadata, which nothing here needs
          const Value& target = values_[size_t(stack_.back())];
          check(target.kind == Kind::Dict, where_, ": BUILD at byte ", op_at_, " on ",
                kind_name(target.kind), "; only a state dict's attributes are accepted");
          break;
        }
        default:
          fail(where_, ": data.pkl holds ", describe_opcode(op), " at byte ", op_at_,
               ", which a state dict of tensors does not use; refused (nothing in the file is "
               "executed)");
      }
    }
  }

 private:
  uint8_t u8() {
    need(1);
    return p_[pos_++];
  }
  uint64_t uint_le(size_t n) {
    need(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t(p_[pos_ + i]) << (8 * i);
    pos_ += n;
    return v;
  }
  void need(uint64_t n) const {
    check(n <= size_ - pos_, where_, ": data.pkl ends inside ", describe_opcode(p_[op_at_]),
          " at byte ", op_at_, " (truncated?)");
  }

  int32_t make(Kind kind) {
    check(values_.size() < kMaxValues, where_, ": data.pkl makes more than ", kMaxValues,
          " values");
    values_.emplace_back();
    values_.back().kind = kind;
    return int32_t(values_.size() - 1);
  }
  void refer(size_t n) {
    references_ += n;
    check(references_ <= kMaxReferences, where_, ": data.pkl holds more than ", kMaxReferences,
          " tuple items, dict entries and memo entries");
  }
  void push(int32_t v) {
    check(stack_.size() < kMaxStack, where_, ": data.pkl's stack grows past ", kMaxStack,
          " values");
    stack_.push_back(v);
  }
  void push_int(int64_t n) {
    const int32_t v = make(Kind::Int);
    values_[size_t(v)].number = n;
    push(v);
  }
  int32_t pop() {
    check(stack_.size() > (marks_.empty() ? 0 : marks_.back()), where_, ": ",
          describe_opcode(p_[op_at_]), " at byte ", op_at_, " pops an empty stack");
    const int32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  size_t pop_mark() {
    check(!marks_.empty(), where_, ": ", describe_opcode(p_[op_at_]), " at byte ", op_at_,
          " without a MARK");
    const size_t base = marks_.back();
    marks_.pop_back();
    return base;
  }
  Value& dict_at(int32_t v) {
    Value& d = values_[size_t(v)];
    check(d.kind == Kind::Dict, where_, ": ", describe_opcode(p_[op_at_]), " at byte ", op_at_,
          " on ", kind_name(d.kind), ", not a dict");
    return d;
  }
  void tuple_of(size_t n) {
    check(stack_.size() >= n + (marks_.empty() ? 0 : marks_.back()), where_, ": ",
          describe_opcode(p_[op_at_]), " at byte ", op_at_, " on a short stack");
    refer(n);
    const int32_t t = make(Kind::Tuple);
    values_[size_t(t)].items.assign(stack_.end() - std::ptrdiff_t(n), stack_.end());
    stack_.resize(stack_.size() - n);
    push(t);
  }
  void put(uint32_t index) {
    check(index < kMaxMemoIndex, where_, ": memo index ", index, " at byte ", op_at_,
          " is out of range");
    check(!stack_.empty(), where_, ": ", describe_opcode(p_[op_at_]), " at byte ", op_at_,
          " on an empty stack");
    if (!memo_.count(index)) refer(1);
    memo_[index] = stack_.back();
  }
  void get(uint32_t index) {
    auto it = memo_.find(index);
    check(it != memo_.end(), where_, ": ", describe_opcode(p_[op_at_]), " at byte ", op_at_,
          " reads memo ", index, ", which was never stored");
    push(it->second);
  }

  std::string line() {
    const size_t start = pos_;
    while (pos_ < size_ && p_[pos_] != '\n') {
      check(pos_ - start < kMaxGlobalLine, where_, ": GLOBAL at byte ", op_at_,
            " names a module or object longer than ", kMaxGlobalLine, " bytes");
      ++pos_;
    }
    need(1);
    std::string s(reinterpret_cast<const char*>(p_ + start), pos_ - start);
    ++pos_;
    return s;
  }
  void global() {
    const std::string module = line(), name = line();
    const std::string full = module + "." + name;
    const int32_t v = make(Kind::Global);
    Value& g = values_[size_t(v)];
    g.text = full;
    if (module == "collections" && name == "OrderedDict") {
      g.callable = Callable::OrderedDict;
    } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      g.callable = Callable::RebuildTensor;
    } else if (module == "torch" && storage_dtype(name, g.dtype)) {
      g.callable = Callable::StorageClass;
    } else {
      fail(where_, ": data.pkl names the global ", full, " at byte ", op_at_,
           "; only collections.OrderedDict, torch._utils._rebuild_tensor_v2 and torch's "
           "Float/Half/BFloat16/Long/Int/Byte storages are accepted (a state dict of tensors; "
           "nothing in the file is executed)");
    }
    push(v);
  }

  const Value& item(const Value& tuple, size_t i) const { return values_[size_t(tuple.items[i])]; }

  // ('storage', storage class, key, location, numel) -> a storage record.
  void persistent_id() {
    const Value& pid = values_[size_t(pop())];
    check(pid.kind == Kind::Tuple && pid.items.size() == 5 && item(pid, 0).kind == Kind::String &&
              item(pid, 0).text == "storage",
          where_, ": BINPERSID at byte ", op_at_,
          " is not a storage reference ('storage', class, key, location, numel)");
    const Value& cls = item(pid, 1);
    check(cls.kind == Kind::Global && cls.callable == Callable::StorageClass, where_,
          ": storage reference at byte ", op_at_, " names ", kind_name(cls.kind),
          " instead of a storage class");
    check(item(pid, 2).kind == Kind::String && item(pid, 3).kind == Kind::String &&
              item(pid, 4).kind == Kind::Int && item(pid, 4).number >= 0,
          where_, ": storage reference at byte ", op_at_,
          " lacks its key, location or element count");
    const DType dtype = cls.dtype;
    std::string key = item(pid, 2).text;
    const uint64_t numel = uint64_t(item(pid, 4).number);
    check(numel <= kMaxElements, where_, ": storage ", key, " of ", numel,
          " elements is absurdly large");
    const int32_t v = make(Kind::Storage);
    values_[size_t(v)].dtype = dtype;
    values_[size_t(v)].text = std::move(key);
    values_[size_t(v)].numel = numel;
    push(v);
  }

  void reduce() {
    const int32_t args_index = pop();
    const int32_t callable_index = pop();
    const Value& f = values_[size_t(callable_index)];
    const Value& args = values_[size_t(args_index)];
    check(f.kind == Kind::Global, where_, ": REDUCE at byte ", op_at_, " calls ",
          kind_name(f.kind));
    check(args.kind == Kind::Tuple, where_, ": REDUCE at byte ", op_at_, " calls ", f.text,
          " with ", kind_name(args.kind), " instead of an argument tuple");
    if (f.callable == Callable::OrderedDict) {
      check(args.items.empty(), where_, ": REDUCE at byte ", op_at_,
            " calls collections.OrderedDict with arguments");
      push(make(Kind::Dict));
      return;
    }
    check(f.callable == Callable::RebuildTensor, where_, ": REDUCE at byte ", op_at_, " calls ",
          f.text, ", which is only accepted inside a storage reference");
    push(rebuild_tensor(args));
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks
  // [, metadata]) with row-major strides and no hooks.
  int32_t rebuild_tensor(const Value& args) {
    const std::string at = " at byte " + std::to_string(op_at_);
    check(args.items.size() == 6 || args.items.size() == 7, where_, ": _rebuild_tensor_v2", at,
          " with ", args.items.size(), " arguments, expected 6 or 7");
    const Value& storage = item(args, 0);
    const Value& offset = item(args, 1);
    const Value& size = item(args, 2);
    const Value& stride = item(args, 3);
    const Value& hooks = item(args, 5);
    check(storage.kind == Kind::Storage, where_, ": _rebuild_tensor_v2", at, " on ",
          kind_name(storage.kind), " instead of a storage");
    check(offset.kind == Kind::Int && offset.number >= 0, where_, ": _rebuild_tensor_v2", at,
          ": the storage offset is not a non-negative int");
    check(size.kind == Kind::Tuple && stride.kind == Kind::Tuple &&
              size.items.size() == stride.items.size() && size.items.size() <= kMaxDims,
          where_, ": _rebuild_tensor_v2", at,
          ": size and stride are not tuples of equal length "
          "(at most ",
          kMaxDims, " dimensions)");
    check(item(args, 4).kind == Kind::Bool, where_, ": _rebuild_tensor_v2", at,
          ": requires_grad is not a bool");
    check(hooks.kind == Kind::Dict && hooks.entries.empty(), where_, ": _rebuild_tensor_v2", at,
          ": backward hooks are not an empty dict");
    if (args.items.size() == 7)
      check(item(args, 6).kind == Kind::None || item(args, 6).kind == Kind::Dict, where_,
            ": _rebuild_tensor_v2", at, ": metadata is neither None nor a dict");
    TorchTensorRecord r;
    r.dtype = storage.dtype;
    r.storage = storage.text;
    r.storage_numel = storage.numel;
    r.offset = uint64_t(offset.number);
    uint64_t count = 1;
    for (size_t i = 0; i < size.items.size(); ++i) {
      const Value& d = item(size, i);
      check(d.kind == Kind::Int && d.number >= 0 && uint64_t(d.number) < kMaxDim, where_,
            ": _rebuild_tensor_v2", at, ": size entry ", i, " is not a sensible dimension");
      const uint64_t dim = uint64_t(d.number);
      check(dim == 0 || count <= kMaxElements / dim, where_, ": _rebuild_tensor_v2", at,
            ": the shape is absurdly large");
      count *= dim;
      r.shape.push_back(int64_t(dim));
    }
    // Row-major strides (those of dimensions of size 1 do not matter, nor any of an empty one).
    if (count > 0) {
      uint64_t expected = 1;
      for (size_t i = size.items.size(); i-- > 0;) {
        const Value& s = item(stride, i);
        check(s.kind == Kind::Int, where_, ": _rebuild_tensor_v2", at, ": stride entry ", i,
              " is not an int");
        check(r.shape[i] == 1 || uint64_t(s.number) == expected, where_, ": _rebuild_tensor_v2", at,
              ": a tensor of shape ", shape_str(r.shape),
              " that is not contiguous (row-major) in its storage; not supported");
        expected *= uint64_t(r.shape[i]);
      }
    }
    check(r.offset <= storage.numel && count <= storage.numel - r.offset, where_,
          ": _rebuild_tensor_v2", at, ": a tensor of ", count, " elements from offset ", r.offset,
          " does not fit in storage ", storage.text, " of ", storage.numel, " elements");
    const int32_t v = make(Kind::Tensor);
    values_[size_t(v)].tensor = int32_t(tensors_.size());
    tensors_.push_back(std::move(r));
    return v;
  }

  std::vector<TorchTensorRecord> finish() {
    check(marks_.empty() && stack_.size() == 1, where_, ": data.pkl stops with ", stack_.size(),
          " values and ", marks_.size(), " open MARKs on its stack, expected one state dict");
    const Value& top = values_[size_t(stack_[0])];
    check(top.kind == Kind::Dict, where_, ": data.pkl holds ", kind_name(top.kind),
          ", expected a state dict (a dict of tensors)");
    std::vector<TorchTensorRecord> out;
    std::set<std::string> names;
    for (const auto& [k, v] : top.entries) {
      const Value& key = values_[size_t(k)];
      const Value& value = values_[size_t(v)];
      check(key.kind == Kind::String, where_, ": the state dict has a key that is ",
            kind_name(key.kind), ", expected strings");
      check(value.kind == Kind::Tensor, where_, ": state dict entry ", key.text, " is ",
            kind_name(value.kind), ", expected a tensor");
      check(names.insert(key.text).second, where_, ": tensor ", key.text, " appears twice");
      TorchTensorRecord r = tensors_[size_t(value.tensor)];
      r.name = key.text;
      out.push_back(std::move(r));
    }
    return out;
  }

  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  size_t references_ = 0;
  const std::string& where_;
  std::vector<Value> values_;
  std::vector<int32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, int32_t> memo_;
  std::vector<TorchTensorRecord> tensors_;
};

}  // namespace

std::vector<TorchTensorRecord> read_torch_state_dict_pickle(std::span<const std::byte> pickle,
                                                            const std::string& where) {
  return Machine(pickle, where).run();
}

}  // namespace klein
