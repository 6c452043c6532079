// The device side of a Session whose daemon runs the CUDA backend
// (PoolDescription::BACKEND_CUDA): the pool's slabs mapped into this process, and the CUDA
// codec calls the Session's reads and writes turn into. Session uses it; workers use the
// Session API (client.h).
//
// Mapping: each slab (quantized blocks, sink blocks, this session's tail slots) is opened
// through the process-wide cache of common/cuda_ipc.h, so a process opens every exported
// slab once however many sessions share it, and the mapping is closed when the last of them
// ends. A client in the daemon's own process (pool.daemon_pid() == getpid(), where CUDA IPC
// cannot open the daemon's handles) uses the daemon's device pointers directly.
//
// Every call here waits for its stream before returning, so its writes are complete (the
// append contract: the daemon reads the tail only after Commit, on its own streams, without
// waiting for the worker's).
//
// This header needs no CUDA include; cuda_pool.cc is compiled only when the library is
// built with CUDA (KVARN_CLIENT_CUDA), and OpenDevicePool exists only then.
//
// Thread safety: all methods may be called concurrently.
#ifndef KVARN_CLIENT_LIB_CUDA_POOL_H_
#define KVARN_CLIENT_LIB_CUDA_POOL_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "client/lib/client.h"
#include "kernels/block_layout.h"
#include "kernels/codec.h"
#include "kernels/preset.h"
#include "kvarn/v1/kvarn.pb.h"

namespace kvarn {

class DevicePool {
 public:
  virtual ~DevicePool() = default;

  // Device pointers to block 0 of each class (null when the pool has none).
  virtual uint8_t* quant() const = 0;
  virtual uint8_t* sink() const = 0;
  virtual uint8_t* tail() const = 0;
  virtual int device() const = 0;
  // Whether the slabs are the daemon's own pointers (a client in the daemon's process).
  virtual bool in_daemon_process() const = 0;

  // Rotates n tokens (original frame, [n][layers][kv_heads][D]) into the fp16 tail slot at
  // token `first`. Host K/V are checked on the host first (the host path's messages) and
  // written only if valid; device K/V are checked by the kernel, and a rejected call may
  // leave tokens [first, first + n) partly written (they are not staged, so no one reads
  // them). On `stream` (null: the calling thread's per-thread stream), which it waits for.
  virtual absl::Status Store(uint8_t* slot, int first, int n, const void* keys, const void* values, DType dtype,
                             bool device_input, CUstream_st* stream) = 0;
  // Decode attention of one layer over `table` (REQUIRES: ids within the pool, checked by
  // the Session). queries/out [num_q_heads][D] f32 and lse (optional) [num_q_heads] on the
  // host, or on the device with device_io; on `stream` as for Store.
  virtual absl::Status Attend(const SequenceTable& table, int layer, const float* queries,
                              int num_q_heads, float* out, float* lse, bool device_io,
                              CUstream_st* stream) = 0;
  // One (layer, kv-head) tile of a quantized block, original frame, into host f32 [G][D].
  virtual absl::Status Dequantize(uint32_t block, int layer, int head, float* keys, float* values) = 0;
  // Blocks the calling thread until `event` has completed.
  virtual absl::Status WaitForEvent(CUevent_st* event) = 0;
};

// Maps the slabs of a BACKEND_CUDA pool. FAILED_PRECONDITION without a usable device,
// INVALID_ARGUMENT for a malformed description, INTERNAL when CUDA IPC fails.
absl::StatusOr<std::unique_ptr<DevicePool>> OpenDevicePool(const v1::PoolDescription& pool, const Preset& preset,
                                                           const BlockLayout& layout);

}  // namespace kvarn

#endif  // KVARN_CLIENT_LIB_CUDA_POOL_H_
