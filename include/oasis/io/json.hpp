// oasis/io/json.hpp — a minimal, strict JSON (RFC 8259) reader and writer helpers.
//
// Used for safetensors headers and for oasis-verify's configuration files. Strict: no comments,
// no trailing commas, no NaN/Infinity literals, no control characters in strings, valid UTF-8,
// duplicate object keys rejected, nesting depth limited (so a hostile file cannot exhaust the
// stack). Numbers keep their text so that integers (shapes, offsets) are read exactly.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace oasis::io::json {

/// Thrown on malformed JSON; what() says what and at which byte offset.
class parse_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Value {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool b = false;
  std::string text;  ///< string contents (decoded), or the number's literal text
  std::vector<Value> items;
  std::vector<std::pair<std::string, Value>> members;  ///< in file order, keys unique

  bool is_object() const { return kind == Kind::object; }
  bool is_array() const { return kind == Kind::array; }
  bool is_string() const { return kind == Kind::string; }
  bool is_number() const { return kind == Kind::number; }
  bool is_bool() const { return kind == Kind::boolean; }
  /// Member by key, nullptr when absent (objects only).
  const Value* find(const std::string& key) const {
    for (const auto& m : members)
      if (m.first == key) return &m.second;
    return nullptr;
  }
  /// The number as a double (strtod of the literal; correctly rounded).
  double as_double() const { return std::strtod(text.c_str(), nullptr); }
  /// The number as a non-negative integer without fraction or exponent; false otherwise
  /// (including overflow of uint64).
  bool as_uint64(std::uint64_t* out) const {
    if (kind != Kind::number || text.empty() || text[0] == '-') return false;
    std::uint64_t v = 0;
    for (char c : text) {
      if (c < '0' || c > '9') return false;
      const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
      if (v > (UINT64_MAX - d) / 10) return false;
      v = v * 10 + d;
    }
    *out = v;
    return true;
  }
};

namespace detail {

class Parser {
 public:
  Parser(const char* p, std::size_t n) : s_(p), n_(n) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (i_ != n_) fail("unexpected data after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void fail(const std::string& what) const {
    throw parse_error("JSON: " + what + " at byte " + std::to_string(i_));
  }
  void skip_ws() {
    while (i_ < n_ && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool literal(const char* word) {
    std::size_t k = 0;
    while (word[k]) {
      if (i_ + k >= n_ || s_[i_ + k] != word[k]) return false;
      ++k;
    }
    i_ += k;
    return true;
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 64 levels");
    if (i_ >= n_) fail("unexpected end of input");
    Value v;
    const char c = s_[i_];
    if (c == '{') {
      v.kind = Value::Kind::object;
      ++i_;
      skip_ws();
      if (i_ < n_ && s_[i_] == '}') { ++i_; return v; }
      for (;;) {
        skip_ws();
        if (i_ >= n_ || s_[i_] != '"') fail("expected a string key");
        std::string key = parse_string();
        for (const auto& m : v.members)
          if (m.first == key) fail("duplicate key \"" + key + "\"");
        skip_ws();
        if (i_ >= n_ || s_[i_] != ':') fail("expected ':'");
        ++i_;
        skip_ws();
        Value item = parse_value(depth + 1);
        v.members.emplace_back(std::move(key), std::move(item));
        skip_ws();
        if (i_ < n_ && s_[i_] == ',') { ++i_; continue; }
        if (i_ < n_ && s_[i_] == '}') { ++i_; return v; }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Value::Kind::array;
      ++i_;
      skip_ws();
      if (i_ < n_ && s_[i_] == ']') { ++i_; return v; }
      for (;;) {
        skip_ws();
        v.items.push_back(parse_value(depth + 1));
        skip_ws();
        if (i_ < n_ && s_[i_] == ',') { ++i_; continue; }
        if (i_ < n_ && s_[i_] == ']') { ++i_; return v; }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Value::Kind::string;
      v.text = parse_string();
      return v;
    }
    if (literal("true")) { v.kind = Value::Kind::boolean; v.b = true; return v; }
    if (literal("false")) { v.kind = Value::Kind::boolean; v.b = false; return v; }
    if (literal("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Value::Kind::number;
      v.text = parse_number();
      return v;
    }
    fail(std::string("unexpected character '") + (c >= 32 && c < 127 ? std::string(1, c) : "\\x?") + "'");
  }

  std::string parse_number() {
    // number = [ minus ] int [ frac ] [ exp ];  int = zero / ( digit1-9 *DIGIT )
    const std::size_t start = i_;
    auto digit = [&](std::size_t k) { return k < n_ && s_[k] >= '0' && s_[k] <= '9'; };
    if (s_[i_] == '-') ++i_;
    if (!digit(i_)) fail("malformed number");
    if (s_[i_] == '0') {
      ++i_;
      if (digit(i_)) fail("leading zero in number");
    } else {
      while (digit(i_)) ++i_;
    }
    if (i_ < n_ && s_[i_] == '.') {
      ++i_;
      if (!digit(i_)) fail("malformed fraction");
      while (digit(i_)) ++i_;
    }
    if (i_ < n_ && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < n_ && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digit(i_)) fail("malformed exponent");
      while (digit(i_)) ++i_;
    }
    if (i_ - start > 400) fail("number literal too long");
    return std::string(s_ + start, i_ - start);
  }

  unsigned hex4() {
    if (i_ + 4 > n_) fail("truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }

  static void put_utf8(unsigned cp, std::string& out) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  // One UTF-8 sequence starting at i_ (validated: no overlong forms, no surrogates, <= U+10FFFF).
  void copy_utf8(std::string& out) {
    const unsigned char c = static_cast<unsigned char>(s_[i_]);
    int len;
    unsigned cp;
    if (c < 0x80) { out.push_back(static_cast<char>(c)); ++i_; return; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else fail("invalid UTF-8 lead byte");
    if (i_ + static_cast<std::size_t>(len) > n_) fail("truncated UTF-8 sequence");
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s_[i_ + static_cast<std::size_t>(k)]);
      if ((cc & 0xC0) != 0x80) fail("invalid UTF-8 continuation byte");
      cp = (cp << 6) | (cc & 0x3F);
    }
    const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("invalid UTF-8 code point");
    out.append(s_ + i_, static_cast<std::size_t>(len));
    i_ += static_cast<std::size_t>(len);
  }

  std::string parse_string() {
    ++i_;  // opening quote
    std::string out;
    for (;;) {
      if (i_ >= n_) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') { ++i_; return out; }
      if (c < 0x20) fail("control character in string");
      if (c != '\\') { copy_utf8(out); continue; }
      ++i_;
      if (i_ >= n_) fail("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // high surrogate: a low one must follow
            if (i_ + 2 > n_ || s_[i_] != '\\' || s_[i_ + 1] != 'u') fail("unpaired surrogate in \\u escape");
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired surrogate in \\u escape");
          }
          put_utf8(cp, out);
          break;
        }
        default: fail("invalid escape");
      }
    }
  }

  const char* s_;
  std::size_t n_;
  std::size_t i_ = 0;
};

}  // namespace detail

/// Parse one JSON document (surrounding whitespace allowed); throws json::parse_error.
inline Value parse(const std::string& text) { return detail::Parser(text.data(), text.size()).parse_document(); }

/// A JSON string literal (with quotes) for `s`.
inline std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          const char* hex = "0123456789abcdef";
          out += "\\u00";
          out.push_back(hex[c >> 4]);
          out.push_back(hex[c & 15]);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  return out + "\"";
}

}  // namespace oasis::io::json
