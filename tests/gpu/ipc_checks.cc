// CUDA IPC between processes (common/cuda_ipc.h), on a real device: the pool's way of
// sharing GPU memory. Needs only the C++ standard library and the CUDA runtime, so it builds
// on the GPU machine (KVARN_KERNELS_ONLY). Prints "SKIPPED: no CUDA device" and exits 0
// without a device.
//
// Checks (the exporter is this process; importers are copies of this binary started with
// posix_spawn, since a CUDA context does not survive fork):
//   cross_process  an importer opens the exported slab twice (one mapping, two references),
//                  reads the exporter's pattern, writes its own; the exporter reads it back.
//   same_process   Acquire of a slab this process exported returns its own pointer.
//   open_close     an importer acquires and releases the slab 1,000 times, then holds 1,000
//                  references at once: one mapping, and the device's free memory unchanged.
//   kill           importers killed with SIGKILL while holding the mapping (--kills, default
//                  128, 8 at a time): the device's free memory returns to its baseline.
//   scan           the daemon's NaN/Inf scan kernel (daemon/backends/nonfinite_scan.h)
//                  reports the first bad element in the CPU sealer's order.
//
// Usage: kvarn_ipc_test [--kills N] [--only NAME]
// Prints "PASS <check>" / "FAIL <check>: why" lines, then "PASSED ipc" or "FAILED ipc".
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "daemon/backends/nonfinite_scan.h"
#include "common/cuda_ipc.h"

extern char** environ;

namespace kvarn::cuda {
namespace {

constexpr size_t kSlabBytes = 16u << 20;
constexpr int64_t kDriftToleranceBytes = 8 << 20;

std::string Hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : bytes) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

std::string Unhex(const std::string& hex) {
  std::string s;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) s += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return s;
}

uint32_t Pattern(size_t i, uint32_t seed) { return static_cast<uint32_t>(i) * 2654435761u ^ seed; }

bool Write(uint8_t* dev, size_t bytes, uint32_t seed, std::string* why) {
  std::vector<uint32_t> host(bytes / 4);
  for (size_t i = 0; i < host.size(); ++i) host[i] = Pattern(i, seed);
  // From pageable memory cudaMemcpy may return before the DMA lands: wait, since another
  // process reads next.
  cudaError_t err = cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) *why = std::string("cudaMemcpy to the slab: ") + cudaGetErrorString(err);
  return err == cudaSuccess;
}

bool Verify(const uint8_t* dev, size_t bytes, uint32_t seed, std::string* why) {
  std::vector<uint32_t> host(bytes / 4);
  if (const cudaError_t err = cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost); err != cudaSuccess) {
    *why = std::string("cudaMemcpy from the slab: ") + cudaGetErrorString(err);
    return false;
  }
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] != Pattern(i, seed)) {
      *why = "word " + std::to_string(i) + " is " + std::to_string(host[i]) + ", expected " +
             std::to_string(Pattern(i, seed)) + " (seed " + std::to_string(seed) + ")";
      return false;
    }
  }
  return true;
}

int64_t FreeBytes() {
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return -1;
  return static_cast<int64_t>(free_bytes);
}

// ---- Importer side (a child process). Exit 0 on success; messages on stderr. ----

int ChildFail(const std::string& why) {
  std::fprintf(stderr, "importer %d: %s\n", static_cast<int>(getpid()), why.c_str());
  return 1;
}

Expected<SharedMapping> AcquireHex(const std::string& hex) {
  Expected<IpcHandle> h = IpcHandle::FromBytes(Unhex(hex));
  if (!h.ok()) return h.status();
  return SharedMapping::Acquire(*h, 0, kSlabBytes);
}

// Opens twice, checks the exporter's pattern (seed 1), writes seed 2.
int ChildCrossProcess(const std::string& hex) {
  Expected<IpcHandle> h = IpcHandle::FromBytes(Unhex(hex));
  if (!h.ok()) return ChildFail(h.status().message());
  {
    Expected<SharedMapping> a = SharedMapping::Acquire(*h, 0, kSlabBytes);
    if (!a.ok()) return ChildFail("first open: " + a.status().message());
    Expected<SharedMapping> b = SharedMapping::Acquire(*h, 0, kSlabBytes);
    if (!b.ok()) return ChildFail("second open through the cache: " + b.status().message());
    if (a->data() != b->data()) return ChildFail("the cache returned two different mappings");
    if (a->local()) return ChildFail("an imported slab claims to be local");
    if (SharedMapping::OpenMappings() != 1 || SharedMapping::References(*h) != 2) {
      return ChildFail("expected one mapping with two references, got " + std::to_string(SharedMapping::OpenMappings()) +
                       " / " + std::to_string(SharedMapping::References(*h)));
    }
    std::string why;
    if (!Verify(a->data(), kSlabBytes, 1, &why)) return ChildFail("reading the exporter's pattern: " + why);
    if (!Write(b->data(), kSlabBytes, 2, &why)) return ChildFail(why);
    if (cudaDeviceSynchronize() != cudaSuccess) return ChildFail("cudaDeviceSynchronize");
  }
  if (SharedMapping::OpenMappings() != 0) return ChildFail("the mapping outlived its last reference");
  return 0;
}

// Churns the mapping, then holds 1,000 references; the device's free memory must not move.
int ChildOpenClose(const std::string& hex) {
  std::string why;
  {
    Expected<SharedMapping> warm = AcquireHex(hex);  // the first open sets up the context
    if (!warm.ok()) return ChildFail(warm.status().message());
  }
  const int64_t before = FreeBytes();
  for (int i = 0; i < 1000; ++i) {
    Expected<SharedMapping> m = AcquireHex(hex);
    if (!m.ok()) return ChildFail("open " + std::to_string(i) + ": " + m.status().message());
    if (i % 100 == 0 && cudaMemset(m->data() + 4 * static_cast<size_t>(i), 0x5A, 4) != cudaSuccess) {
      return ChildFail("writing through mapping " + std::to_string(i));
    }
  }
  if (SharedMapping::OpenMappings() != 0) return ChildFail("mappings left open after 1,000 open/close");
  const int64_t after_churn = FreeBytes();
  std::vector<SharedMapping> held;
  for (int i = 0; i < 1000; ++i) {
    Expected<SharedMapping> m = AcquireHex(hex);
    if (!m.ok()) return ChildFail("holding open " + std::to_string(i) + ": " + m.status().message());
    held.push_back(std::move(m).value());
  }
  Expected<IpcHandle> h = IpcHandle::FromBytes(Unhex(hex));
  if (SharedMapping::OpenMappings() != 1 || SharedMapping::References(*h) != 1000) {
    return ChildFail("1,000 opens held: " + std::to_string(SharedMapping::OpenMappings()) + " mappings, " +
                     std::to_string(SharedMapping::References(*h)) + " references (want 1, 1000)");
  }
  for (size_t i = 1; i < held.size(); ++i) {
    if (held[i].data() != held[0].data()) return ChildFail("held opens point at different mappings");
  }
  held.clear();
  const int64_t after_hold = FreeBytes();
  std::printf("open_close: free bytes %lld before, %lld after 1,000 open/close, %lld after 1,000 held\n",
              static_cast<long long>(before), static_cast<long long>(after_churn), static_cast<long long>(after_hold));
  if (before < 0 || std::llabs(after_churn - before) > kDriftToleranceBytes ||
      std::llabs(after_hold - before) > kDriftToleranceBytes) {
    return ChildFail("device free memory drifted");
  }
  return 0;
}

// Maps the slab, writes seed 3 + its index into one word, reports ready on fd 3, waits to die.
int ChildHold(const std::string& hex, int index) {
  Expected<SharedMapping> m = AcquireHex(hex);
  if (!m.ok()) return ChildFail(m.status().message());
  const uint32_t v = 3u + static_cast<uint32_t>(index);
  if (cudaMemcpy(m->data() + 4 * static_cast<size_t>(index % 1024), &v, 4, cudaMemcpyHostToDevice) != cudaSuccess) {
    return ChildFail("writing through the mapping");
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return ChildFail("cudaDeviceSynchronize");
  const char ready = 'R';
  if (write(3, &ready, 1) != 1) return ChildFail("reporting ready");
  for (;;) pause();
}

// ---- Exporter side. ----

struct Child {
  pid_t pid = -1;
  int ready_fd = -1;
};

Child Spawn(const std::vector<std::string>& args, bool with_ready_pipe) {
  Child c;
  int fds[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (with_ready_pipe) {
    if (pipe2(fds, O_CLOEXEC) != 0) return c;
    if (fds[1] == 3) {  // dup2(3, 3) would keep close-on-exec: move it out of the way
      const int moved = fcntl(fds[1], F_DUPFD_CLOEXEC, 10);
      close(fds[1]);
      fds[1] = moved;
    }
    posix_spawn_file_actions_adddup2(&actions, fds[1], 3);  // the dup is not close-on-exec
  }
  std::vector<std::string> all = {"/proc/self/exe"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ) == 0) c.pid = pid;
  posix_spawn_file_actions_destroy(&actions);
  if (with_ready_pipe) {
    close(fds[1]);
    c.ready_fd = fds[0];
  }
  return c;
}

int Wait(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

struct Report {
  int failed = 0;
  void Pass(const char* name) { std::printf("PASS %s\n", name); }
  void Fail(const char* name, const std::string& why) {
    std::printf("FAIL %s: %s\n", name, why.c_str());
    ++failed;
  }
};

void CheckCrossProcess(Report& r) {
  const char* name = "cross_process";
  Expected<ExportedSlab> slab = ExportedSlab::Create(0, kSlabBytes);
  if (!slab.ok()) return r.Fail(name, slab.status().message());
  std::string why;
  if (!Write(slab->data(), kSlabBytes, 1, &why)) return r.Fail(name, why);
  const Child c = Spawn({"--child", "cross", Hex(slab->handle().ToBytes())}, false);
  if (c.pid < 0) return r.Fail(name, "cannot start the importer");
  if (const int rc = Wait(c.pid); rc != 0) return r.Fail(name, "the importer exited with " + std::to_string(rc));
  if (!Verify(slab->data(), kSlabBytes, 2, &why)) return r.Fail(name, "reading back the importer's writes: " + why);
  r.Pass(name);
}

void CheckSameProcess(Report& r) {
  const char* name = "same_process";
  Expected<ExportedSlab> slab = ExportedSlab::Create(0, kSlabBytes);
  if (!slab.ok()) return r.Fail(name, slab.status().message());
  const size_t exports = SharedMapping::LocalExports();
  {
    Expected<SharedMapping> m = SharedMapping::Acquire(slab->handle(), 0, kSlabBytes);
    if (!m.ok()) return r.Fail(name, "acquiring our own export: " + m.status().message());
    if (!m->local() || m->data() != slab->data()) return r.Fail(name, "did not return the exporter's pointer");
    if (SharedMapping::OpenMappings() != 0) return r.Fail(name, "opened an IPC mapping of our own slab");
  }
  Expected<IpcHandle> bad = IpcHandle::FromBytes("short");
  if (bad.ok()) return r.Fail(name, "a 5-byte handle was accepted");
  *slab = ExportedSlab();  // freeing forgets the export
  if (SharedMapping::LocalExports() != exports - 1) return r.Fail(name, "a freed slab is still registered");
  r.Pass(name);
}

void CheckOpenClose(Report& r) {
  const char* name = "open_close";
  Expected<ExportedSlab> slab = ExportedSlab::Create(0, kSlabBytes);
  if (!slab.ok()) return r.Fail(name, slab.status().message());
  const Child c = Spawn({"--child", "openclose", Hex(slab->handle().ToBytes())}, false);
  if (c.pid < 0) return r.Fail(name, "cannot start the importer");
  std::fflush(stdout);
  if (const int rc = Wait(c.pid); rc != 0) return r.Fail(name, "the importer exited with " + std::to_string(rc));
  r.Pass(name);
}

// Free device memory once it stops moving (two readings 100 ms apart agree; at most 3 s).
int64_t StableFree() {
  int64_t last = FreeBytes();
  for (int i = 0; i < 30; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int64_t now = FreeBytes();
    if (now == last) return now;
    last = now;
  }
  return last;
}

// Free device memory once the driver has cleaned up after dead processes: polls until it is
// back within the tolerance of `baseline` or 10 s pass.
int64_t SettledFree(int64_t baseline) {
  int64_t now = FreeBytes();
  for (int i = 0; i < 100 && std::llabs(now - baseline) > kDriftToleranceBytes; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    now = FreeBytes();
  }
  return now;
}

void CheckKill(Report& r, int kills) {
  const char* name = "kill";
  Expected<ExportedSlab> slab = ExportedSlab::Create(0, kSlabBytes);
  if (!slab.ok()) return r.Fail(name, slab.status().message());
  const std::string hex = Hex(slab->handle().ToBytes());
  const auto round = [&](int first, int count) -> std::string {
    std::vector<Child> kids;
    std::string err;
    for (int i = 0; i < count && err.empty(); ++i) {
      const Child k = Spawn({"--child", "hold", hex, std::to_string(first + i)}, true);
      if (k.pid < 0) err = "cannot start importer " + std::to_string(first + i);
      if (k.pid >= 0) kids.push_back(k);
      if (k.pid < 0 && k.ready_fd >= 0) close(k.ready_fd);
    }
    for (Child& k : kids) {  // every started importer is killed and reaped, error or not
      pollfd p{k.ready_fd, POLLIN, 0};
      char b = 0;
      if (err.empty() && !(poll(&p, 1, 60000) == 1 && read(k.ready_fd, &b, 1) == 1 && b == 'R')) {
        err = "importer " + std::to_string(k.pid) + " never mapped the slab";
      }
      kill(k.pid, SIGKILL);
      Wait(k.pid);
      close(k.ready_fd);
    }
    return err;
  };
  // One round first, so the baseline excludes whatever the driver sets up once.
  if (std::string e = round(0, 1); !e.empty()) return r.Fail(name, e);
  const int64_t baseline = StableFree();
  constexpr int kParallel = 8;
  for (int done = 0; done < kills; done += kParallel) {
    if (std::string e = round(done, std::min(kParallel, kills - done)); !e.empty()) return r.Fail(name, e);
  }
  const int64_t after = SettledFree(baseline);
  std::printf("kill: %d importers killed holding the mapping; free bytes %lld before, %lld after\n", kills,
              static_cast<long long>(baseline), static_cast<long long>(after));
  if (std::llabs(after - baseline) > kDriftToleranceBytes) return r.Fail(name, "device free memory drifted");
  // The exporter's slab is intact and still holds what the importers wrote.
  uint32_t word = 0;
  if (cudaMemcpy(&word, slab->data() + 4, 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
    return r.Fail(name, "the slab is unreadable after the kills");
  }
  if (kills >= 2 && word != 3u + 1u && word != 3u + 1u + 1024u) {
    return r.Fail(name, "word 1 holds " + std::to_string(word) + ", not what importer 1 wrote");
  }
  r.Pass(name);
}

// Finds NaN at a known place of an fp16 slot, and none in a clean one.
void CheckScan(Report& r) {
  const char* name = "scan";
  BlockLayout l;
  l.num_layers = 3;
  l.num_kv_heads = 2;
  l.head_dim = 64;
  l.tile_tokens = 64;
  std::vector<uint16_t> host(l.fp16_block_bytes() / 2, 0x3C00);  // 1.0
  void* d = nullptr;
  void* result = nullptr;
  if (cudaMalloc(&d, l.fp16_block_bytes()) != cudaSuccess || cudaMalloc(&result, 8) != cudaSuccess) {
    return r.Fail(name, "cudaMalloc");
  }
  const auto run = [&](int first, int count) -> unsigned long long {
    unsigned long long v = 0;
    cudaMemcpy(d, host.data(), l.fp16_block_bytes(), cudaMemcpyHostToDevice);
    cudaMemset(result, 0xFF, 8);
    if (LaunchNonFiniteScan(static_cast<const uint8_t*>(d), l, first, count,
                            static_cast<unsigned long long*>(result), nullptr) != cudaSuccess) {
      return 0;
    }
    cudaMemcpy(&v, result, 8, cudaMemcpyDeviceToHost);
    return v;
  };
  std::string why;
  if (run(0, 64) != ~0ull) why = "a clean slot reported a bad element";
  // Values of layer 2, kv-head 1, token 40, channel 7 (Inf), and keys of layer 1, kv-head 0,
  // token 50, channel 3 (NaN): the scan of tokens [30, 60) goes in memory order, token by
  // token (the slot is token-major), so it must name the values one, in token 40, first.
  const size_t t_elems = l.fp16_token_elems();
  const size_t vi = (l.Fp16ValuesOffset(2, 1) / 2) + 40 * t_elems + 7;
  const size_t ki = (l.Fp16KeysOffset(1, 0) / 2) + 50 * t_elems + 3;
  host[vi] = 0x7C00;
  host[ki] = 0x7E00;
  const unsigned long long got = run(30, 30);
  // Expected index: from token 30's row, 10 token rows, then the values row's offset + 7.
  const unsigned long long want = 10 * t_elems + l.Fp16ValuesOffset(2, 1) / 2 + 7;
  if (why.empty() && got != want) why = "first bad element " + std::to_string(got) + ", want " + std::to_string(want);
  // Tokens [51, 64) hold neither bad element.
  if (why.empty() && run(51, 13) != ~0ull) why = "tokens past both bad elements reported one";
  host[ki] = 0x3C00;
  const unsigned long long only_v = run(0, 64);
  const unsigned long long want_v = 40 * t_elems + l.Fp16ValuesOffset(2, 1) / 2 + 7;
  if (why.empty() && only_v != want_v) {
    why = "values Inf reported at " + std::to_string(only_v) + ", want " + std::to_string(want_v);
  }
  cudaFree(d);
  cudaFree(result);
  if (!why.empty()) return r.Fail(name, why);
  r.Pass(name);
}

int Main(int argc, char** argv) {
  if (argc >= 4 && std::strcmp(argv[1], "--child") == 0) {
    const std::string mode = argv[2];
    if (mode == "cross") return ChildCrossProcess(argv[3]);
    if (mode == "openclose") return ChildOpenClose(argv[3]);
    if (mode == "hold" && argc >= 5) return ChildHold(argv[3], std::atoi(argv[4]));
    return ChildFail("unknown child mode " + mode);
  }
  int kills = 128;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--kills") == 0) kills = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
  }
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "none visible");
    return 0;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) std::printf("device: %s\n", prop.name);
  std::fflush(stdout);
  Report r;
  const auto want = [&](const char* n) { return only.empty() || only == n; };
  if (want("cross_process")) CheckCrossProcess(r);
  if (want("same_process")) CheckSameProcess(r);
  if (want("open_close")) CheckOpenClose(r);
  if (want("kill")) CheckKill(r, kills);
  if (want("scan")) CheckScan(r);
  std::printf(r.failed == 0 ? "PASSED ipc\n" : "FAILED ipc (%d checks)\n", r.failed);
  return r.failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvarn::cuda

int main(int argc, char** argv) { return kvarn::cuda::Main(argc, argv); }
