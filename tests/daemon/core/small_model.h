// The small model of the core's tests and fuzzers (no gtest, so the fuzzers can include it).
#ifndef KVARN_TESTS_DAEMON_CORE_SMALL_MODEL_H_
#define KVARN_TESTS_DAEMON_CORE_SMALL_MODEL_H_

#include <cstdint>
#include <string>

#include "daemon/core/kv_core.h"

namespace kvarn::testing {

constexpr uint32_t kSmallModelLayers = 2;
constexpr uint32_t kSmallModelHeadDim = 64;

// L=2 layers, D=64, 64-token tiles of kvarn_k4v2_g64 unless `preset` says otherwise.
inline ModelConfig SmallModel(const std::string& preset = "kvarn_k4v2_g64", uint32_t sink = 64,
                              uint32_t kv_heads = 2, const std::string& model_id = "test-model") {
  ModelConfig m;
  m.model_id = model_id;
  m.num_layers = kSmallModelLayers;
  m.num_kv_heads = kv_heads;
  m.head_dim = kSmallModelHeadDim;
  m.preset = preset;
  m.sink_tokens = sink;
  return m;
}

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_DAEMON_CORE_SMALL_MODEL_H_
