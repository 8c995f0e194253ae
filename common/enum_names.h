// One table per enum that is also a config word (fsdp.mode, fsdp.bucketing, ...): the value and
// its spelling, so parsing, printing and the "must be one of" list cannot drift apart.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace meshwork {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

template <typename E, size_t N>
const char* NameOf(const EnumName<E> (&names)[N], E value) {
  for (const auto& n : names) {
    if (n.value == value) return n.name;
  }
  return "?";
}

template <typename E, size_t N>
std::optional<E> ParseName(const EnumName<E> (&names)[N], std::string_view text) {
  for (const auto& n : names) {
    if (text == n.name) return n.value;
  }
  return std::nullopt;
}

// "none, block, auto"
template <typename E, size_t N>
std::string NameList(const EnumName<E> (&names)[N]) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + std::string(n.name);
  return out;
}

}  // namespace meshwork
