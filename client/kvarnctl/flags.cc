#include "client/kvarnctl/flags.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>

#include "common/units.h"

namespace kvarn::ctl {
namespace {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

CodecStatus ParseInt(std::string_view text, int64_t min, int64_t max, const std::string& what,
                     int64_t* out) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != end) {
    return InvalidArgument(what + ": '" + std::string(text) + "' is not an integer");
  }
  if (ec == std::errc::result_out_of_range || v < min || v > max) {
    return InvalidArgument(what + ": " + std::string(text) + " is out of range " +
                           std::to_string(min) + ".." + std::to_string(max));
  }
  *out = v;
  return {};
}

const char kSizeUnits[] = "B, KiB, MiB, GiB, TiB (binary), KB, MB, GB, TB (decimal)";

CodecStatus ParseSize(std::string_view text, const std::string& what, uint64_t* out) {
  const absl::StatusOr<uint64_t> bytes = ParseBytes(absl::string_view(text.data(), text.size()));
  if (bytes.ok()) {
    *out = *bytes;
    return {};
  }
  std::string message = what + ": " + std::string(bytes.status().message());
  // Name the unit when the unit itself is what ParseBytes refuses: its trailing letters,
  // which ParseBytes also refuses after a plain "1".
  size_t letters = text.size();
  while (letters > 0 && std::isalpha(static_cast<unsigned char>(text[letters - 1]))) --letters;
  const std::string unit(text.substr(letters));
  if (!unit.empty() && !ParseBytes("1" + unit).ok()) {
    message += " (unknown unit '" + unit + "'; units: " + kSizeUnits + ")";
  }
  return InvalidArgument(message);
}

void FlagSet::Add(Flag flag) { flags_.push_back(std::move(flag)); }

void FlagSet::String(std::string name, std::string* out, std::string value_name, std::string help,
                     bool required) {
  Add({std::move(name), Kind::kString, out, 0, 0, std::move(value_name), std::move(help),
       required});
}

void FlagSet::StringList(std::string name, std::vector<std::string>* out, std::string value_name,
                         std::string help, bool required) {
  Add({std::move(name), Kind::kStringList, out, 0, 0, std::move(value_name), std::move(help),
       required});
}

void FlagSet::Int(std::string name, int64_t* out, int64_t min, int64_t max, std::string value_name,
                  std::string help, bool required) {
  Add({std::move(name), Kind::kInt, out, min, max, std::move(value_name), std::move(help),
       required});
}

void FlagSet::Uint64(std::string name, uint64_t* out, std::string value_name, std::string help) {
  Add({std::move(name), Kind::kUint64, out, 0, 0, std::move(value_name), std::move(help)});
}

void FlagSet::Bytes(std::string name, uint64_t* out, std::string value_name, std::string help,
                    bool required) {
  Add({std::move(name), Kind::kBytes, out, 0, 0, std::move(value_name),
       std::move(help) + " (units: " + kSizeUnits + ", or plain bytes)", required});
}

void FlagSet::Duration(std::string name, absl::Duration* out, std::string value_name,
                       std::string help) {
  Add({std::move(name), Kind::kDuration, out, 0, 0, std::move(value_name), std::move(help)});
}

void FlagSet::Bool(std::string name, bool* out, std::string help) {
  Add({std::move(name), Kind::kBool, out, 0, 0, "", std::move(help)});
}

FlagSet::Flag* FlagSet::Find(std::string_view name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagSet::Seen(std::string_view name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.seen;
  }
  return false;
}

std::string FlagSet::Closest(std::string_view name) const {
  std::string best;
  size_t best_distance = 3;  // suggest only near misses
  for (const Flag& f : flags_) {
    const size_t d = EditDistance(name, f.name);
    if (d < best_distance) {
      best_distance = d;
      best = f.name;
    }
  }
  return best;
}

CodecStatus FlagSet::Error(const std::string& message) const {
  return InvalidArgument(command_ + ": " + message);
}

CodecStatus FlagSet::Assign(Flag* flag, const std::string& value) {
  const std::string what = "--" + flag->name;
  switch (flag->kind) {
    case Kind::kString:
      if (value.empty()) return Error(what + " needs a non-empty value");
      *static_cast<std::string*>(flag->out) = value;
      return {};
    case Kind::kStringList:
      if (value.empty()) return Error(what + " needs a non-empty value");
      static_cast<std::vector<std::string>*>(flag->out)->push_back(value);
      return {};
    case Kind::kInt: {
      const CodecStatus s =
          ParseInt(value, flag->min, flag->max, what, static_cast<int64_t*>(flag->out));
      return s.ok() ? s : Error(s.message());
    }
    case Kind::kUint64: {
      uint64_t v = 0;
      const char* end = value.data() + value.size();
      const auto [ptr, ec] = std::from_chars(value.data(), end, v);
      if (value.empty() || ec == std::errc::invalid_argument || ptr != end) {
        return Error(what + ": '" + value + "' is not a non-negative integer");
      }
      if (ec == std::errc::result_out_of_range) {
        return Error(what + ": " + value + " does not fit in 64 bits");
      }
      *static_cast<uint64_t*>(flag->out) = v;
      return {};
    }
    case Kind::kBytes: {
      const CodecStatus s = ParseSize(value, what, static_cast<uint64_t*>(flag->out));
      return s.ok() ? s : Error(s.message());
    }
    case Kind::kDuration: {
      absl::Duration d;
      if (!absl::ParseDuration(value, &d) || d <= absl::ZeroDuration() ||
          d == absl::InfiniteDuration()) {
        return Error(what + ": '" + value +
                     "' is not a positive duration with its unit, such as 500ms, 2s or 1m");
      }
      *static_cast<absl::Duration*>(flag->out) = d;
      return {};
    }
    case Kind::kBool:
      *static_cast<bool*>(flag->out) = true;
      return {};
  }
  return Error("internal: unknown flag kind");
}

CodecStatus FlagSet::Parse(std::span<const std::string> args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (!arg.starts_with("--") || arg.size() == 2) {
      return Error("unexpected argument '" + arg + "' (flags start with --; see --help)");
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    Flag* flag = Find(name);
    if (flag == nullptr) {
      const std::string hint = Closest(name);
      return Error(
          "unknown flag --" + name +
          (hint.empty() ? std::string(" (see --help)") : " (did you mean --" + hint + "?)"));
    }
    if (flag->seen && flag->kind != Kind::kStringList) {
      return Error("--" + name + " given more than once");
    }
    flag->seen = true;
    if (flag->kind == Kind::kBool) {
      if (eq != std::string::npos) return Error("--" + name + " takes no value");
      KVARN_RETURN_IF_ERROR(Assign(flag, ""));
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 >= args.size()) {
        return Error("--" + name + " needs a value (" + flag->value_name + ")");
      }
      if (args[i + 1].starts_with("--")) {
        return Error("--" + name + " needs a value (" + flag->value_name + "), got flag " +
                     args[i + 1]);
      }
      value = args[++i];
    }
    KVARN_RETURN_IF_ERROR(Assign(flag, value));
  }
  if (help_requested_) return {};
  for (const Flag& f : flags_) {
    if (f.required && !f.seen) return Error("missing required flag --" + f.name);
  }
  return {};
}

std::string FlagSet::Usage() const {
  std::vector<std::string> left;
  size_t width = 0;
  for (const Flag& f : flags_) {
    std::string l = "  --" + f.name;
    if (!f.value_name.empty()) l += " " + f.value_name;
    width = std::max(width, l.size());
    left.push_back(std::move(l));
  }
  std::string out;
  for (size_t i = 0; i < flags_.size(); ++i) {
    out += left[i];
    out.append(width + 3 - left[i].size(), ' ');
    out += flags_[i].help;
    const bool list = flags_[i].kind == Kind::kStringList;
    if (flags_[i].required)
      out += list ? " (required, repeatable)" : " (required)";
    else if (list)
      out += " (repeatable)";
    out += '\n';
  }
  return out;
}

}  // namespace kvarn::ctl
