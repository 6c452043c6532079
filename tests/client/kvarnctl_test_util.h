// Helpers for the kvarnctl tests: a scratch directory per test, running a subcommand
// handler with captured streams, writing .npy inputs, and checking JSON output with a real
// parser (python3's json module, in a child process). The integration tests include it too.
#ifndef KVARN_TESTS_CLIENT_KVARNCTL_TEST_UTIL_H_
#define KVARN_TESTS_CLIENT_KVARNCTL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "client/kvarnctl/command.h"
#include "kernels/fp16.h"
#include "kernels/npy.h"
#include "tests/common/json.h"

namespace kvarn::ctl::testing {

// A fresh directory under the test temp dir, named after the running test.
inline std::string ScratchDir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("kvarnctl_test_" + name + "." + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

struct RunResult {
  int code = -1;
  std::string out;
  std::string err;
};

// Runs a handler with its arguments; `err_is_terminal` as a terminal would set it.
inline RunResult RunCommand(CommandHandler handler, std::vector<std::string> args,
                            bool err_is_terminal = false) {
  std::ostringstream out, err;
  const CommandIo io{out, err, err_is_terminal};
  RunResult r;
  r.code = handler(args, io);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// The tests write empty arrays on purpose; kernels/npy.cc passes data() to memcpy and
// fwrite even when it is empty, and a null pointer there is undefined (UBSan reports it),
// so the buffer is given capacity up front.
inline void WriteF32(const std::string& path, std::vector<size_t> shape,
                     const std::vector<float>& data) {
  NpyArray a;
  a.type = NpyType::kF32;
  a.shape = std::move(shape);
  a.data.reserve(data.size() * 4 + 1);
  a.data.resize(data.size() * 4);
  if (!data.empty()) std::memcpy(a.data.data(), data.data(), a.data.size());
  ASSERT_TRUE(WriteNpy(path, a).ok()) << path;
}

inline void WriteF16(const std::string& path, std::vector<size_t> shape,
                     const std::vector<float>& data) {
  NpyArray a;
  a.type = NpyType::kF16;
  a.shape = std::move(shape);
  a.data.resize(data.size() * 2);
  for (size_t i = 0; i < data.size(); ++i) {
    const uint16_t h = FloatToHalf(data[i]);
    std::memcpy(&a.data[2 * i], &h, 2);
  }
  ASSERT_TRUE(WriteNpy(path, a).ok()) << path;
}

inline std::vector<float> ReadF32(const std::string& path, std::vector<size_t>* shape = nullptr) {
  NpyArray a;
  const CodecStatus s = ReadNpy(path, &a);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (shape != nullptr) *shape = a.shape;
  return a.ToFloat();
}

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
}

// Deterministic pseudo-random floats in [-scale, scale).
inline std::vector<float> Pattern(size_t n, uint32_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = scale * (static_cast<float>(x >> 8) / 8388608.0f - 1.0f);
  }
  return v;
}

// One kvarn::testing::Json per non-empty line.
inline std::vector<kvarn::testing::Json> ParseJsonLines(const std::string& text) {
  std::vector<kvarn::testing::Json> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(kvarn::testing::Json::Parse(line));
  }
  return lines;
}

// Checks `text` with python3's json module, strictly: UTF-8, RFC 8259 (no NaN or Infinity,
// no control characters in strings), no duplicate keys in an object; with `lines`, JSON
// Lines (every line one value, the text ending in a newline). Returns each value as python
// re-encodes it (json.dumps: keys in their order, ", " and ": " separators, non-ASCII as
// UTF-8); on any failure, a test failure with python's reason and the text, and nothing.
inline std::vector<std::string> StrictJsonText(const std::string& text, bool lines = false) {
  static std::atomic<int> counter{0};
  const std::string base = std::filesystem::path(::testing::TempDir()) /
                           ("kvarnctl_json." + std::to_string(getpid()) + "." + std::to_string(counter++));
  const std::string script = base + ".py", in = base + ".in", out = base + ".out", err = base + ".err";
  {
    std::ofstream f(script);
    f << "import json, sys\n"
         "def constant(name):\n"
         "    raise ValueError('not RFC 8259 JSON: ' + name)\n"
         "def unique(pairs):\n"
         "    keys = [k for k, _ in pairs]\n"
         "    if len(keys) != len(set(keys)):\n"
         "        raise ValueError('duplicate key in ' + repr(keys))\n"
         "    return dict(pairs)\n"
         "data = sys.stdin.buffer.read().decode('utf-8')\n"
         "if sys.argv[1] == 'lines':\n"
         "    if not data.endswith('\\n'):\n"
         "        raise ValueError('JSON Lines must end with a newline')\n"
         "    docs = data[:-1].split('\\n')\n"
         "else:\n"
         "    docs = [data]\n"
         "for d in docs:\n"
         "    v = json.loads(d, parse_constant=constant, object_pairs_hook=unique)\n"
         "    sys.stdout.buffer.write(json.dumps(v, ensure_ascii=False, allow_nan=False).encode('utf-8') + b'\\n')\n";
  }
  {
    std::ofstream f(in, std::ios::binary);
    f << text;
  }
  const std::string cmd = "python3 '" + script + "' " + (lines ? "lines" : "doc") + " <'" + in + "' >'" + out +
                          "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  const auto slurp = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  std::vector<std::string> values;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << "not valid JSON" << (lines ? " Lines" : "") << ": " << slurp(err) << "in:\n" << text;
  } else {
    std::istringstream normalized(slurp(out));
    std::string line;
    while (std::getline(normalized, line)) values.push_back(line);
  }
  for (const std::string& f : {script, in, out, err}) std::filesystem::remove(f);
  return values;
}

// StrictJsonText, each value read back as a kvarn::testing::Json.
inline std::vector<kvarn::testing::Json> StrictJson(const std::string& text, bool lines = false) {
  std::vector<kvarn::testing::Json> values;
  for (const std::string& v : StrictJsonText(text, lines)) values.push_back(kvarn::testing::Json::Parse(v));
  return values;
}

// StrictJson of a text that must be exactly one JSON value; a test failure otherwise, and
// then a null value.
inline kvarn::testing::Json StrictJsonValue(const std::string& text) {
  std::vector<kvarn::testing::Json> v = StrictJson(text);
  if (v.size() != 1) {
    ADD_FAILURE() << "expected one JSON value, got " << v.size();
    return kvarn::testing::Json::Parse("null");
  }
  return v[0];
}

}  // namespace kvarn::ctl::testing

#endif  // KVARN_TESTS_CLIENT_KVARNCTL_TEST_UTIL_H_
