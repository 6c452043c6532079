// Reading and writing NumPy .npy files (format versions 1-3), so K/V dumped from PyTorch
// with numpy.save can be fed to the codec tools and tests. Little-endian, C order only.
#ifndef KVARN_KERNELS_NPY_H_
#define KVARN_KERNELS_NPY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/status.h"

namespace kvarn {

enum class NpyType { kF32, kF16, kF64, kU8 };

struct NpyArray {
  NpyType type = NpyType::kF32;
  std::vector<size_t> shape;
  std::vector<uint8_t> data;  // raw little-endian elements, C order

  size_t size() const;  // number of elements
  size_t ElementBytes() const;
  // The elements widened to float (f32, f16, f64, u8 all convert).
  std::vector<float> ToFloat() const;
  std::string ShapeString() const;  // "(3, 128, 128)"
};

// Errors name the file and what is wrong: not an npy file, big-endian, Fortran order,
// unsupported dtype, truncated data.
CodecStatus ReadNpy(const std::string& path, NpyArray* out);
CodecStatus ParseNpy(const uint8_t* bytes, size_t size, const std::string& name, NpyArray* out);

// Writes float32 data of the given shape (format 1.0, header padded to 64 bytes).
CodecStatus WriteNpyF32(const std::string& path, const std::vector<size_t>& shape,
                        const float* data);
CodecStatus WriteNpy(const std::string& path, const NpyArray& array);

}  // namespace kvarn

#endif  // KVARN_KERNELS_NPY_H_
