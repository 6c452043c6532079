// Helpers for the kvarnctl tests: a scratch directory per test, running a subcommand
// handler with captured streams, and writing .npy inputs.
#ifndef KVARN_TESTS_CLIENT_KVARNCTL_TEST_UTIL_H_
#define KVARN_TESTS_CLIENT_KVARNCTL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
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

}  // namespace kvarn::ctl::testing

#endif  // KVARN_TESTS_CLIENT_KVARNCTL_TEST_UTIL_H_
