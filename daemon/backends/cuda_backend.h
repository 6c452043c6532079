// The CUDA memory backend: the pool lives in device memory of one GPU, in a few large slabs
// (the quantized blocks, the sink blocks, and one slab of tail slots per session), each a
// cudaMalloc exported once with legacy CUDA IPC (common/cuda_ipc.h says why not VMM with
// file descriptors). Describe() gives a client what it needs to map a slab: the IPC handle,
// the device ordinal and, for a client in the daemon's own process, the device pointer.
//
// Retention: a tail slab is lent to one client process (LendTo, from the descriptor channel,
// which knows the peer's kernel-verified pid), which writes it through its own mapping. When
// the region is destroyed (the session ended: closed, or its lease expired while the client
// hung) and that process is still running, the slab is kept, counted by RetainedBytes() (the
// core charges it to the tail budget), and freed by Sweep() once the process is gone. Sweep
// reads /proc, so the daemon calls it from its housekeeping loop, never under the core's
// lock. The quantized and sink slabs live as long as the daemon. So the daemon never frees a
// slab while a session's process can have it mapped. (Kept slabs are not handed back to a
// later session of the same process: the pid a session declares is not verified until its
// descriptor handshake, so reuse could give one process memory another may still write.)
//
// Thread safety: all methods may be called concurrently. Regions may outlive the backend.
#ifndef KVARN_DAEMON_BACKENDS_CUDA_BACKEND_H_
#define KVARN_DAEMON_BACKENDS_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/backends/slab_retention.h"
#include "daemon/core/kv_core.h"
#include "daemon/core/memory.h"

namespace kvarn {

class CudaBackend final : public MemoryBackend {
 public:
  // Whether `device` exists, supports unified addressing, and can allocate and export a
  // slab; `why` (optional) says why not.
  static bool DeviceUsable(int device, std::string* why = nullptr);
  // FAILED_PRECONDITION when the device is not usable. probe: process liveness for
  // retention (null: the system's).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device, const ProcessProbe* probe = nullptr);

  // RESOURCE_EXHAUSTED when the device has no room, INTERNAL for other CUDA errors.
  absl::StatusOr<std::unique_ptr<Region>> Create(RegionKind kind, size_t bytes) override;
  uint64_t RetainedBytes() const override;
  void Sweep() override;
  const char* name() const override { return "cuda"; }
  bool NeedsImporterPid() const override { return true; }
  bool host_accessible() const override { return false; }

  // Builds CudaSealers on this device, each with up to `lanes` streams.
  SealerFactory MakeSealerFactory(int lanes = 4) const;
  int device() const;
  // Slabs kept for live client processes (as of now; Sweep frees those of dead ones).
  size_t retained_slabs() const;

  struct State;  // the device and the retention list, shared with the regions

 private:
  explicit CudaBackend(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_BACKENDS_CUDA_BACKEND_H_
