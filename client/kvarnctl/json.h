// kvarnctl's JSON output: a small writer that builds one JSON text (RFC 8259) into a
// string, for every command's --json. Daemon replies are encoded by protobuf
// (MessageToJsonString) and spliced in with Raw() or RawMembers(); everything kvarnctl
// computes itself is written here.
//
// Output is on one line ("key": value, items separated by ", "), so a stream of objects is
// JSON Lines. Strings are UTF-8: '"', '\\' and the control characters U+0000..U+001F are
// escaped, and bytes that are not valid UTF-8 become U+FFFD, so any input (a file path, a
// name) yields valid JSON. Non-finite doubles, which JSON cannot represent, are written as
// null.
//
// The writer checks nothing about nesting: a key outside an object, or an unbalanced End,
// yields invalid text. Thread safety: one writer per thread.
#ifndef KVARN_CLIENT_KVARNCTL_JSON_H_
#define KVARN_CLIENT_KVARNCTL_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvarn::ctl {

// `s` as a quoted JSON string, escaped as described above.
std::string JsonQuote(std::string_view s);

class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  // The key of the next value. REQUIRES: inside an object.
  JsonWriter& Key(std::string_view key);

  JsonWriter& String(std::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Uint(uint64_t value);
  // The shortest text that reads back as the same double; null when not finite.
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();
  // A value that is already JSON text (e.g. protobuf's encoding of a message).
  JsonWriter& Raw(std::string_view json);
  // The members of `object_json` (an encoded JSON object, e.g. protobuf's) as members of the
  // object being written. REQUIRES: inside an object; object_json is one valid JSON object.
  JsonWriter& RawMembers(std::string_view object_json);

  // Shorthands: Key(key) then the value.
  JsonWriter& Field(std::string_view key, std::string_view value) { return Key(key).String(value); }
  JsonWriter& Field(std::string_view key, const char* value) { return Key(key).String(value); }
  JsonWriter& Field(std::string_view key, int64_t value) { return Key(key).Int(value); }
  JsonWriter& Field(std::string_view key, int value) { return Key(key).Int(value); }
  JsonWriter& Field(std::string_view key, uint64_t value) { return Key(key).Uint(value); }
  JsonWriter& Field(std::string_view key, uint32_t value) { return Key(key).Uint(value); }
  JsonWriter& Field(std::string_view key, double value) { return Key(key).Double(value); }
  JsonWriter& Field(std::string_view key, bool value) { return Key(key).Bool(value); }

  const std::string& str() const { return out_; }

 private:
  // Writes the separator a new value or key needs at this point.
  void Separate();

  std::string out_;
  std::vector<bool> empty_;  // per open container: nothing written in it yet
  bool after_key_ = false;
};

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_JSON_H_
