// Runs one suite of tests/gpu/checks.h. Built twice: kvarn_gpu_checks runs the CUDA kernels
// (exits 0 printing "SKIPPED: no CUDA device" where there is none) and
// kvarn_gpu_emulated_checks runs the same kernel bodies on the CPU block emulator.
//
// Usage: <binary> golden|encode|store|attention|schedule|all|smoke [--full]
//   --full: the emulator runs the device's coverage (every preset and head_dim; slow).
//   smoke: a few small launches of every kernel, e.g. under compute-sanitizer.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "tests/gpu/checks.h"

#if KVARN_GPU_DEVICE
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_codec.h"
#endif

namespace kvarn::cuda::testing {
namespace {

int Usage() {
  std::fprintf(
      stderr,
      "usage: kvarn_gpu_checks golden|encode|store|attention|schedule|all|smoke [--full]\n");
  return 2;
}

int Main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const std::string suite = argv[1];
  const bool full = argc > 2 && std::strcmp(argv[2], "--full") == 0;
#if KVARN_GPU_DEVICE
  std::string why;
  if (!DeviceAvailable(&why)) {
    std::printf("SKIPPED: no CUDA device (%s)\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::printf("device: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount);
  }
  std::unique_ptr<KernelRunner> runner = MakeDeviceRunner();
  (void)full;
  const Coverage cov = suite == "smoke" ? SmokeCoverage() : FullCoverage();
#else
  std::unique_ptr<KernelRunner> runner = MakeEmuRunner();
  const Coverage cov = suite == "smoke" ? SmokeCoverage()
                       : full           ? FullCoverage()
                                        : EmulatorCoverage();
#endif
  Report report(std::string(runner->name()) + " " + suite);
  if (suite == "smoke") {
    CheckEncodeDecode(*runner, cov, report);
    CheckStore(*runner, cov, report);
    CheckAttention(*runner, cov, report);
    return report.Finish();
  }
  const bool all = suite == "all";
  bool known = all;
  if (all || suite == "golden") known = true, CheckGolden(*runner, cov, report);
  if (all || suite == "encode") known = true, CheckEncodeDecode(*runner, cov, report);
  if (all || suite == "store") known = true, CheckStore(*runner, cov, report);
  if (all || suite == "attention") known = true, CheckAttention(*runner, cov, report);
#if !KVARN_GPU_DEVICE
  if (all || suite == "schedule") known = true, CheckScheduleIndependence(report);
#endif
  if (!known) return Usage();
  return report.Finish();
}

}  // namespace
}  // namespace kvarn::cuda::testing

int main(int argc, char** argv) { return kvarn::cuda::testing::Main(argc, argv); }
