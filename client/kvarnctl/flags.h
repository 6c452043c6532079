// A small, strict command-line flag parser for kvarnctl's subcommands.
//
// Each subcommand declares its flags on a FlagSet, then calls Parse() with its arguments.
// Accepted forms: `--name value` and `--name=value` for valued flags, `--name` alone for
// switches. Parse() rejects, each with its own message naming the flag:
//   - a flag that was not declared (with a "did you mean" hint when one is close),
//   - a valued flag with no value (end of arguments, or the next word is a flag),
//   - a number that does not parse completely or is out of its declared range,
//   - a size or a duration that does not parse (a size names its unit when that is the
//     part that is wrong),
//   - a value given to a switch (`--json=1`),
//   - a non-repeatable flag given twice, a positional argument, a missing required flag.
// `--help` / `-h` is always accepted and sets help_requested() (required flags are then
// not checked).
//
// Thread safety: a FlagSet is used by one thread; it keeps pointers to the caller's
// variables, which must outlive Parse().
#ifndef KVARN_CLIENT_KVARNCTL_FLAGS_H_
#define KVARN_CLIENT_KVARNCTL_FLAGS_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "kernels/status.h"

namespace kvarn::ctl {

class FlagSet {
 public:
  // `command` prefixes error messages, e.g. "codec eval".
  explicit FlagSet(std::string command) : command_(std::move(command)) {}

  // A string-valued flag. `value_name` is shown in the usage line ("--keys K.npy").
  void String(std::string name, std::string* out, std::string value_name, std::string help,
              bool required = false);
  // A flag that may be given several times; each value is appended.
  void StringList(std::string name, std::vector<std::string>* out, std::string value_name,
                  std::string help, bool required = false);
  // An integer flag, decimal, within [min, max].
  void Int(std::string name, int64_t* out, int64_t min, int64_t max, std::string value_name,
           std::string help, bool required = false);
  // An unsigned 64-bit integer flag (seeds), decimal.
  void Uint64(std::string name, uint64_t* out, std::string value_name, std::string help);
  // A size in bytes with an optional unit: "1MiB", "512KiB", "2GiB", "1.5GB", "4096B" or
  // plain bytes, read by common/units.h ParseBytes, the parser kvarnd's configuration uses.
  // Positive. `help` is followed by the accepted units in Usage().
  void Bytes(std::string name, uint64_t* out, std::string value_name, std::string help,
             bool required = false);
  // A positive, finite duration with its unit: "500ms", "2s", "1.5s", "1m"
  // (absl::ParseDuration).
  void Duration(std::string name, absl::Duration* out, std::string value_name, std::string help);
  // A switch: present sets *out = true.
  void Bool(std::string name, bool* out, std::string help);

  // REQUIRES: called once.
  CodecStatus Parse(std::span<const std::string> args);

  bool help_requested() const { return help_requested_; }
  // Whether the flag appeared on the command line (for flags whose default means "infer").
  bool Seen(std::string_view name) const;
  // One line per flag: "  --name VALUE   help", aligned.
  std::string Usage() const;

 private:
  enum class Kind { kString, kStringList, kInt, kUint64, kBytes, kDuration, kBool };
  struct Flag {
    std::string name;  // without the leading "--"
    Kind kind;
    void* out;
    int64_t min = 0, max = 0;
    std::string value_name;
    std::string help;
    bool required = false;
    bool seen = false;
  };

  void Add(Flag flag);
  Flag* Find(std::string_view name);
  CodecStatus Assign(Flag* flag, const std::string& value);
  std::string Closest(std::string_view name) const;
  CodecStatus Error(const std::string& message) const;

  std::string command_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
};

// Parses a complete decimal integer in [min, max]; `what` names it in the error.
CodecStatus ParseInt(std::string_view text, int64_t min, int64_t max, const std::string& what,
                     int64_t* out);

// Parses a size as FlagSet::Bytes does; `what` names it in the error, which also names the
// unit when the unit is what kvarnd does not know ("unknown unit 'XB'").
CodecStatus ParseSize(std::string_view text, const std::string& what, uint64_t* out);

// The units ParseSize accepts, for help texts: "B, KiB, MiB, GiB, TiB (binary), KB, MB, GB,
// TB (decimal)".
extern const char kSizeUnits[];

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_FLAGS_H_
