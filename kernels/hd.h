// KVARN_HD marks functions compiled for both host and device when nvcc builds the file.
#ifndef KVARN_KERNELS_HD_H_
#define KVARN_KERNELS_HD_H_

#if defined(__CUDACC__)
#define KVARN_HD __host__ __device__
#else
#define KVARN_HD
#endif

#endif  // KVARN_KERNELS_HD_H_
