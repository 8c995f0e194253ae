#include "common/base64.h"

namespace meshwork {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int Value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  unsigned buf = 0;
  int bits = 0;
  for (unsigned char c : in) {
    buf = (buf << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(kAlphabet[(buf >> bits) & 0x3F]);
    }
  }
  if (bits > 0) out.push_back(kAlphabet[(buf << (6 - bits)) & 0x3F]);
  while (out.size() % 4 != 0) out.push_back('=');
  return out;
}

std::optional<std::string> Base64Decode(std::string_view in, std::string* why) {
  std::string out;
  unsigned buf = 0;
  int bits = 0;
  bool padded = false;
  for (char ch : in) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      padded = true;
      continue;
    }
    const int v = Value(c);
    if (padded || v < 0) {
      if (why != nullptr) *why = padded ? "data after '=' padding" : std::string("unexpected character '") + ch + "'";
      return std::nullopt;
    }
    buf = (buf << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buf >> bits) & 0xFF));
    }
  }
  if (bits >= 6) {  // one character alone encodes no whole byte
    if (why != nullptr) *why = "truncated input";
    return std::nullopt;
  }
  return out;
}

}  // namespace meshwork
