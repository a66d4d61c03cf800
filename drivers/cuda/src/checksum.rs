//! The GPU side of the position-aware checksum: the CUDA kernel. The CPU reference
//! ([`checksum_at`], [`mix`]) lives in `ubdirect_core::util::checksum` and is re-exported here.

pub use ubdirect_core::util::checksum::{checksum_at, mix};

/// The CUDA C source of the same checksum; accumulates into `*acc` with atomics.
pub const KERNEL_SRC: &str = r#"
__device__ __forceinline__ unsigned long long ub_mix(unsigned long long w, unsigned long long i) {
    unsigned long long x = w ^ (i * 0x9E3779B97F4A7C15ULL);
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27; x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}
extern "C" __global__ void ub_checksum(const unsigned long long* data, unsigned long long nbytes,
                                       unsigned long long word_base, unsigned long long* acc) {
    unsigned long long nwords = nbytes / 8;
    unsigned long long rem = nbytes % 8;
    unsigned long long sum = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < nwords; i += stride)
        sum += ub_mix(data[i], word_base + i);
    if (rem != 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        const unsigned char* b = (const unsigned char*)(data + nwords);
        unsigned long long w = 0;
        for (unsigned long long k = 0; k < rem; k++) w |= ((unsigned long long)b[k]) << (8 * k);
        sum += ub_mix(w, word_base + nwords);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(acc, sum);
}
"#;
