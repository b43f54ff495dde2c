#pragma once
// Reading one field of a model's JSON configuration with the checks every reader needs: a
// missing or null key keeps the caller's default, and a value of the wrong type is an error
// naming the file and the key. Integers must be JSON integers: a float where an integer
// belongs is refused rather than converted (1e102 does not fit any integer type).
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace klein {

namespace json_fields_detail {
template <class T>
struct IntegerList : std::false_type {};
template <>
struct IntegerList<std::vector<int64_t>> : std::true_type {};
template <size_t N>
struct IntegerList<std::array<int64_t, N>> : std::true_type {};
}  // namespace json_fields_detail

template <class T>
void read_json_field(const nlohmann::json& j, const char* key, T& out, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return;
  const nlohmann::json& v = j[key];
  auto integer = [](const nlohmann::json& x) { return x.is_number_integer(); };
  bool ok = true;
  const char* expected = "";
  if constexpr (std::is_same_v<T, bool>) {
    ok = v.is_boolean();
    expected = "true or false";
  } else if constexpr (std::is_integral_v<T>) {
    ok = integer(v);
    expected = "an integer";
  } else if constexpr (std::is_floating_point_v<T>) {
    ok = v.is_number();
    expected = "a number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    ok = v.is_string();
    expected = "a string";
  } else if constexpr (json_fields_detail::IntegerList<T>::value) {
    ok = v.is_array() && std::all_of(v.begin(), v.end(), integer);
    expected = "a list of integers";
    if constexpr (!std::is_same_v<T, std::vector<int64_t>>) {
      if (ok && v.size() != std::tuple_size_v<T>)
        fail(where, ": key \"", key, "\" must be a list of ", std::tuple_size_v<T>,
             " integers, got ", v.dump());
    }
  } else {
    static_assert(sizeof(T) == 0, "read_json_field: unsupported field type");
  }
  if (!ok)
    fail(where, ": key \"", key, "\" has the wrong type (", v.type_name(), "); expected ",
         expected);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // Fits T: an unsigned JSON integer above INT64_MAX or a value outside a narrow T is refused.
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      check(u <= uint64_t(std::numeric_limits<T>::max()), where, ": key \"", key, "\" is too large (",
            u, ")");
    } else {
      const int64_t s = v.get<int64_t>();
      check(s >= int64_t(std::numeric_limits<T>::min()) &&
                (s < 0 || uint64_t(s) <= uint64_t(std::numeric_limits<T>::max())),
            where, ": key \"", key, "\" is out of range (", s, ")");
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    const double d = v.get<double>();
    check(!(d > 3.4e38 || d < -3.4e38), where, ": key \"", key, "\" is out of range for a float (",
          d, ")");
  }
  out = v.get<T>();
}

// A configuration value checked against what the tensor shapes say: an error naming the file
// and the key when they differ.
inline void check_config_matches_weights(const std::string& where, const char* key,
                                         int64_t config_value, int64_t weights_value) {
  check(config_value == weights_value, where, ": \"", key,
        "\" does not match the weights (config says ", config_value, ", tensor shapes say ",
        weights_value, ")");
}

}  // namespace klein
