#include "kernels/cuda/cuda_codec.h"

#include <string>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/params.h"

namespace kvarn::cuda {
namespace {

CodecStatus ClearStatus(int32_t* status, size_t count, cudaStream_t stream) {
  if (status == nullptr) return {};
  return FromCuda(cudaMemsetAsync(status, 0, count * sizeof(int32_t), stream), "clearing status");
}

}  // namespace

bool DeviceAvailable(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why != nullptr) {
      *why = err != cudaSuccess
                 ? std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err)
                 : std::string("no device");
    }
    cudaGetLastError();  // reset the runtime's last-error state for later calls
    return false;
  }
  return true;
}

CodecStatus QueryDevice(DeviceLimits* out) {
  int dev = 0;
  KVARN_RETURN_IF_ERROR(FromCuda(cudaGetDevice(&dev), "cudaGetDevice"));
  int sms = 0, smem = 0;
  KVARN_RETURN_IF_ERROR(
      FromCuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count"));
  KVARN_RETURN_IF_ERROR(
      FromCuda(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
               "shared memory size"));
  out->num_sms = sms;
  out->max_smem_per_block = static_cast<size_t>(smem);
  return {};
}

CodecStatus EncodeBlock(const Preset& preset, const BlockLayout& layout, const TileSource& in,
                        uint8_t* quant_block, int32_t* status, cudaStream_t stream,
                        const EncodeOptions& options) {
  DeviceLimits limits;
  KVARN_RETURN_IF_ERROR(QueryDevice(&limits));
  EncodeLaunch launch;
  KVARN_RETURN_IF_ERROR(
      BuildEncode(preset, layout, in, quant_block, status, options.iterations, limits, &launch));
  KVARN_RETURN_IF_ERROR(ClearStatus(status, layout.slots(), stream));
  void* scratch = nullptr;
  if (launch.scratch_bytes > 0) {
    KVARN_RETURN_IF_ERROR(
        FromCuda(cudaMallocAsync(&scratch, launch.scratch_bytes, stream), "encode scratch"));
  }
  const CodecStatus launched =
      FromCuda(LaunchEncode(launch.params, launch.grid, static_cast<float*>(scratch), stream),
               "encode kernel");
  if (scratch != nullptr) {
    KVARN_RETURN_IF_ERROR(FromCuda(cudaFreeAsync(scratch, stream), "encode scratch"));
  }
  return launched;
}

CodecStatus DecodeBlock(const Preset& preset, const BlockLayout& layout, const uint8_t* quant_block,
                        const TileSink& out, int32_t* status, cudaStream_t stream) {
  DecodeLaunch launch;
  KVARN_RETURN_IF_ERROR(BuildDecode(preset, layout, quant_block, out, status, &launch));
  DeviceLimits limits;
  KVARN_RETURN_IF_ERROR(QueryDevice(&limits));
  KVARN_RETURN_IF_ERROR(ClearStatus(status, layout.slots(), stream));
  return FromCuda(LaunchDecode(launch.params, launch.grid, stream), "decode kernel");
}

CodecStatus StoreTokens(const Preset& preset, const BlockLayout& layout, const TokenSource& in,
                        int num_tokens, int layer, int token_offset, uint16_t* fp16_block,
                        int32_t* status, cudaStream_t stream) {
  StoreLaunch launch;
  KVARN_RETURN_IF_ERROR(
      BuildStore(preset, layout, in, num_tokens, layer, token_offset, fp16_block, status, &launch));
  DeviceLimits limits;
  KVARN_RETURN_IF_ERROR(QueryDevice(&limits));
  KVARN_RETURN_IF_ERROR(ClearStatus(status, static_cast<size_t>(num_tokens), stream));
  return FromCuda(LaunchStore(launch.params, launch.grid, launch.smem_bytes, stream),
                  "store kernel");
}

CodecStatus AttendDecode(const Preset& preset, const BlockLayout& layout, const AttendArgs& args,
                         cudaStream_t stream) {
  DeviceLimits limits;
  KVARN_RETURN_IF_ERROR(QueryDevice(&limits));
  AttendLaunch launch;
  KVARN_RETURN_IF_ERROR(BuildAttend(preset, layout, args, limits, &launch));
  KVARN_RETURN_IF_ERROR(ClearStatus(args.status, static_cast<size_t>(args.num_seqs), stream));
  KVARN_RETURN_IF_ERROR(FromCuda(LaunchAttend(launch.params, launch.head_chunk, launch.grid_x,
                                              launch.grid_y, launch.grid_z, stream),
                                 "attention kernel"));
  if (launch.combine_rows > 0) {
    KVARN_RETURN_IF_ERROR(
        FromCuda(LaunchCombine(launch.combine, launch.combine_rows, stream), "combine kernel"));
  }
  return {};
}

}  // namespace kvarn::cuda
