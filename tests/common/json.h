// A small JSON reader for test manifests (std only, so the GPU tests can use it too).
// Parses the full grammar into a tree; numbers become double. Not for untrusted input
// of unbounded size: recursion depth is limited to 64.
#ifndef KVARN_TESTS_COMMON_JSON_H_
#define KVARN_TESTS_COMMON_JSON_H_

#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvarn::testing {

class Json {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  static Json Parse(const std::string& text) {
    size_t pos = 0;
    Json j = ParseValue(text, &pos, 0);
    SkipSpace(text, &pos);
    if (pos != text.size()) throw std::runtime_error("json: trailing characters");
    return j;
  }

  Kind kind() const { return kind_; }
  bool AsBool() const { return bool_; }
  double AsNumber() const { return number_; }
  const std::string& AsString() const { return string_; }
  const std::vector<Json>& AsArray() const { return array_; }
  bool Has(const std::string& key) const { return object_.count(key) != 0; }
  const Json& operator[](const std::string& key) const {
    auto it = object_.find(key);
    if (it == object_.end()) throw std::runtime_error("json: no key " + key);
    return it->second;
  }

 private:
  static void SkipSpace(const std::string& s, size_t* p) {
    while (*p < s.size() && (s[*p] == ' ' || s[*p] == '\n' || s[*p] == '\t' || s[*p] == '\r')) ++*p;
  }
  static void Expect(const std::string& s, size_t* p, char c) {
    SkipSpace(s, p);
    if (*p >= s.size() || s[*p] != c) throw std::runtime_error(std::string("json: expected ") + c);
    ++*p;
  }
  static std::string ParseString(const std::string& s, size_t* p) {
    Expect(s, p, '"');
    std::string out;
    while (*p < s.size() && s[*p] != '"') {
      char c = s[(*p)++];
      if (c == '\\') {
        if (*p >= s.size()) break;
        char e = s[(*p)++];
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'u': {
            if (*p + 4 > s.size()) throw std::runtime_error("json: bad \\u escape");
            const unsigned cp = std::stoul(s.substr(*p, 4), nullptr, 16);
            *p += 4;
            if (cp < 0x80) {
              out += static_cast<char>(cp);
            } else if (cp < 0x800) {
              out += static_cast<char>(0xC0 | (cp >> 6));
              out += static_cast<char>(0x80 | (cp & 0x3F));
            } else {
              out += static_cast<char>(0xE0 | (cp >> 12));
              out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
              out += static_cast<char>(0x80 | (cp & 0x3F));
            }
            break;
          }
          default: out += e;
        }
      } else {
        out += c;
      }
    }
    Expect(s, p, '"');
    return out;
  }
  static Json ParseValue(const std::string& s, size_t* p, int depth) {
    if (depth > 64) throw std::runtime_error("json: nested too deeply");
    SkipSpace(s, p);
    if (*p >= s.size()) throw std::runtime_error("json: unexpected end");
    Json j;
    const char c = s[*p];
    if (c == '{') {
      j.kind_ = Kind::kObject;
      ++*p;
      SkipSpace(s, p);
      if (*p < s.size() && s[*p] == '}') { ++*p; return j; }
      for (;;) {
        std::string key = ParseString(s, p);
        Expect(s, p, ':');
        j.object_[key] = ParseValue(s, p, depth + 1);
        SkipSpace(s, p);
        if (*p < s.size() && s[*p] == ',') { ++*p; continue; }
        Expect(s, p, '}');
        return j;
      }
    }
    if (c == '[') {
      j.kind_ = Kind::kArray;
      ++*p;
      SkipSpace(s, p);
      if (*p < s.size() && s[*p] == ']') { ++*p; return j; }
      for (;;) {
        j.array_.push_back(ParseValue(s, p, depth + 1));
        SkipSpace(s, p);
        if (*p < s.size() && s[*p] == ',') { ++*p; continue; }
        Expect(s, p, ']');
        return j;
      }
    }
    if (c == '"') {
      j.kind_ = Kind::kString;
      j.string_ = ParseString(s, p);
      return j;
    }
    if (s.compare(*p, 4, "true") == 0) { *p += 4; j.kind_ = Kind::kBool; j.bool_ = true; return j; }
    if (s.compare(*p, 5, "false") == 0) { *p += 5; j.kind_ = Kind::kBool; return j; }
    if (s.compare(*p, 4, "null") == 0) { *p += 4; return j; }
    const char* begin = s.c_str() + *p;
    char* end = nullptr;
    j.number_ = std::strtod(begin, &end);
    if (end == begin) throw std::runtime_error("json: bad value");
    *p += static_cast<size_t>(end - begin);
    j.kind_ = Kind::kNumber;
    return j;
  }

  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  double number_ = 0.0;
  std::string string_;
  std::vector<Json> array_;
  std::map<std::string, Json> object_;
};

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_COMMON_JSON_H_
