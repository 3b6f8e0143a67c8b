"""The CUDA C that every generated module starts with: types, half and narrow-type conversions,
NaN-aware min/max, block and warp reductions, L2 prefetch and the programmatic-dependent-launch wait.
codegen/cuda.py renders kernels against these names; codegen/host.py compiles the same text for the CPU.
"""
from __future__ import annotations

# Self-contained: NVRTC has no CUDA headers at hand on a build machine, so half conversions are PTX
# and the special float values are bit patterns.
HALF_CONVERSIONS = r"""
__device__ __forceinline__ float h2f(f16 h) { float f; asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ f16 f2h(float f) { f16 h; asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float b2f(bf16 h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ bf16 f2b(float f) { bf16 h; asm("{ cvt.rn.bf16.f32 %0, %1; }" : "=h"(h) : "f"(f)); return h; }
"""
# Narrow types are bytes. Minifloats (float8, float4) are decoded and encoded (round to nearest even)
# by one template over the format: E exponent bits, M mantissa bits, bias B, and the kind of special
# values K: 0 inf and NaN at the top exponent (e5m2), 1 NaN at all ones and no inf (e4m3fn), 2 NaN at
# 0x80, no inf and no -0 (the fnuz types), 3 none (e2m1). Out-of-range values become what ml_dtypes
# (and so onnx's reference) gives: inf for e5m2, NaN for e4m3fn and fnuz, the largest value for e2m1;
# Cast's saturation is a clamp before this. Sub-byte integers are kept in the low bits.
NARROW_CONVERSIONS = r"""
template <int E, int M, int B, int K> __device__ __forceinline__ float g_mf_decode(unsigned char b) {
  const unsigned sbit = 1u << (E + M), mag = b & (sbit - 1u), e = mag >> M, m = mag & ((1u << M) - 1u);
  const float sign = (b & sbit) ? -1.0f : 1.0f;
  if ((K == 2 && b == sbit) || (K == 1 && mag == sbit - 1u) || (K == 0 && e == (1u << E) - 1u && m))
    return G_NAN;
  if (K == 0 && e == (1u << E) - 1u) return sign * G_INF;
  return sign * (e ? ldexpf((float)((1u << M) | m), (int)e - B - M) : ldexpf((float)m, 1 - B - M));
}
template <int E, int M, int B, int K> __device__ __forceinline__ unsigned char g_mf_encode(float x) {
  const unsigned sbit = 1u << (E + M), s = (__float_as_uint(x) >> 31) ? sbit : 0u;
  const unsigned maxmag = K == 0 ? ((((1u << E) - 1u) << M) - 1u) : K == 1 ? sbit - 2u : sbit - 1u;
  if (x != x) return (unsigned char)(K == 2 ? sbit : K == 3 ? (s ^ sbit) : (s | (K == 0 ? sbit - 2u : sbit - 1u)));
  const float a = fabsf(x);
  unsigned mag = 0xffffffffu;
  if (a != G_INF) {
    int e;
    frexpf(a, &e);
    const int lead = e - 1;   /* a = 1.f * 2^lead */
    if (a == 0.0f || lead < 1 - B) mag = (unsigned)rintf(ldexpf(a, B - 1 + M));   /* subnormal steps */
    else mag = ((unsigned)(lead + B) << M) + ((unsigned)rintf(ldexpf(a, M - lead)) - (1u << M));  /* a carry bumps e */
  }
  if (mag > maxmag) {
    if (K == 3) mag = maxmag;
    else if (K == 0) mag = maxmag + 1u;
    else return (unsigned char)(K == 2 ? sbit : (s | (sbit - 1u)));
  }
  return (unsigned char)(K == 2 && mag == 0u ? 0u : (s | mag));
}
template <int BITS> __device__ __forceinline__ signed char g_int_decode(unsigned char b) {
  const int m = (1 << BITS) - 1, top = 1 << (BITS - 1);
  return (signed char)(((b & m) ^ top) - top);
}
template <int BITS> __device__ __forceinline__ unsigned char g_uint_decode(unsigned char b) { return b & ((1u << BITS) - 1u); }
template <int BITS> __device__ __forceinline__ unsigned char g_int_encode(long long v) { return (unsigned char)(v & ((1 << BITS) - 1)); }
"""
COMMON = r"""
#define G_INF __int_as_float(0x7f800000)
#define G_NAN __int_as_float(0x7fffffff)
template <typename T> __device__ __forceinline__ bool g_isinf(T a) { return a == (T)G_INF || a == -(T)G_INF; }
template <typename T> __device__ __forceinline__ T g_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> __device__ __forceinline__ T g_min(T a, T b) { return (a != a || a < b) ? a : b; }
template <typename T> __device__ __forceinline__ T g_sign(T a) { return (T)((a > (T)0) - (a < (T)0)); }
/* a / b and a % b (C's truncation) by a size argument of a merged function (codegen/module.py): 32-bit where
   both are in [0, 2^31), as good as the constant it stands for; a 64-bit division is some 70 instructions */
__device__ __forceinline__ long long g_idiv(long long a, long long b) {
  return (((unsigned long long)a | (unsigned long long)b) >> 31) == 0 ? (long long)((unsigned)a / (unsigned)b) : a / b;
}
__device__ __forceinline__ long long g_imod(long long a, long long b) {
  return (((unsigned long long)a | (unsigned long long)b) >> 31) == 0 ? (long long)((unsigned)a % (unsigned)b) : a % b;
}
struct g_op_sum { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct g_op_prod { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; } };
struct g_op_max { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return g_max<T>(a, b); } };
struct g_op_min { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return g_min<T>(a, b); } };
"""
# Row mode: combine each thread's partial over the block; warp mode: over the warp (a row per warp).
# Every thread gets the result.
BLOCK_REDUCE = r"""
#define G_WARP 32
template <typename T, typename Op> __device__ __forceinline__ T g_warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename T, typename Op> __device__ __forceinline__ T g_block_reduce(T v, Op op) {
  __shared__ T g_partial[32];
  v = g_warp_reduce<T, Op>(v, op);
  if (blockDim.x <= 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();   /* the previous reduction's readers are done with g_partial */
  if (lane == 0) g_partial[warp] = v;
  __syncthreads();
  v = g_partial[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); ++w) v = op(v, g_partial[w]);
  return v;
}
"""
# argmax/argmin: each thread has the best (value, index) of its stride; combine the pairs. A thread
# that saw no element has index -1; equal values keep the first index (the last for *_last), which is
# what one thread scanning in order would have kept.
BLOCK_ARGREDUCE = r"""
template <typename T> __device__ __forceinline__ bool g_arg_better(T v, i64 i, T bv, i64 bi, bool want_max, bool last) {
  if (i < 0) return false;
  if (bi < 0) return true;
  if (v == bv) return last ? i > bi : i < bi;
  return want_max ? v > bv : v < bv;
}
template <typename T> __device__ __forceinline__ void g_warp_argreduce(T& best, i64& at, bool want_max, bool last) {
  for (int o = 16; o > 0; o >>= 1) {
    const T v = __shfl_xor_sync(0xffffffffu, best, o);
    const i64 i = __shfl_xor_sync(0xffffffffu, at, o);
    if (g_arg_better<T>(v, i, best, at, want_max, last)) { best = v; at = i; }
  }
}
template <typename T> __device__ __forceinline__ void g_block_argreduce(T& best, i64& at, bool want_max, bool last) {
  __shared__ T g_pbest[32];
  __shared__ i64 g_pat[32];
  g_warp_argreduce<T>(best, at, want_max, last);
  if (blockDim.x <= 32) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) { g_pbest[warp] = best; g_pat[warp] = at; }
  __syncthreads();
  best = g_pbest[0]; at = g_pat[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
    if (g_arg_better<T>(g_pbest[w], g_pat[w], best, at, want_max, last)) { best = g_pbest[w]; at = g_pat[w]; }
}
"""
TYPES = "typedef long long i64;\ntypedef unsigned short f16;\ntypedef unsigned short bf16;\n"
# L2 prefetch of an address a kernel will read later (codegen of row mode: _prefetch_column_loads)
PREFETCH = '#define G_PREFETCH(p) asm volatile("prefetch.global.L2 [%0];" :: "l"(p))\n'
# Programmatic dependent launch (Hopper). A kernel node joined to its predecessor by a programmatic
# edge (runtime/cuda/graph.py) may start while that predecessor still runs. Every kernel calls
# G_AWAIT_PREDECESSOR() before it reads anything a kernel wrote or writes anything at all; before the
# call it may read weights only. griddepcontrol.wait returns once the predecessor has finished and its
# writes are visible. Right after it, launch_dependents lets this kernel's own successor start: one
# kernel in flight ahead, no deeper, since a cascade would fill the SMs with blocks that only wait.
# Without a programmatic edge (and below sm_90) both instructions are no-ops.
DEPENDENT_LAUNCH = r"""
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define G_AWAIT_PREDECESSOR() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define G_AWAIT_PREDECESSOR() ((void)0)
#endif
"""
# Eight 4-bit codes (a word, low nibble first) minus an integer zero point z, dotted with eight halves, in
# float32 (codegen/vectors.py NibbleDot). Codes c0 and c4 ORed into 1024's half bits are the pair of halves
# (1024 + c0, 1024 + c4); c1 and c5 so are 1024 + 16 c1, scaled by 1/16 to 64 + c1: one subtraction of the
# bias then leaves (c - z) exactly, two codes at a time, with no integer-to-float conversion.
NIBBLE_DOT = r"""
/* (a & b) | c in one lop3 (written as C, the two constants took two: lop3 has one immediate operand) */
__device__ __forceinline__ unsigned g_and_or(unsigned a, unsigned b, unsigned c) {
  unsigned d; asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d;
}
__device__ __forceinline__ float g_dot8_q4(uint4 x, unsigned w, float z) {
  const unsigned one = 0x64006400u, sixteenth = 0x2C002C00u;
  const unsigned b0 = f2h(1024.f + z), b1 = f2h(-64.f - z), z0 = b0 | (b0 << 16), z1 = b1 | (b1 << 16);
  unsigned q[4];
  const unsigned t0 = g_and_or(w, 0x000F000Fu, one), t1 = g_and_or(w, 0x00F000F0u, one);
  const unsigned t2 = g_and_or(w >> 8, 0x000F000Fu, one), t3 = g_and_or(w >> 8, 0x00F000F0u, one);
  asm("sub.f16x2 %0, %1, %2;" : "=r"(q[0]) : "r"(t0), "r"(z0));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(q[1]) : "r"(t1), "r"(sixteenth), "r"(z1));
  asm("sub.f16x2 %0, %1, %2;" : "=r"(q[2]) : "r"(t2), "r"(z0));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(q[3]) : "r"(t3), "r"(sixteenth), "r"(z1));
  const unsigned xs[4] = {x.x, x.y, x.z, x.w};   /* halves x0 x1 | x2 x3 | x4 x5 | x6 x7 */
  float s = 0.f;
  #pragma unroll
  for (int i = 0; i < 8; ++i) {   /* code i: q[i % 4]'s low half for i < 4, its high half after */
    const f16 c = (f16)(i < 4 ? q[i] & 0xFFFFu : q[i - 4] >> 16);
    s += h2f((f16)(i % 2 ? xs[i / 2] >> 16 : xs[i / 2] & 0xFFFFu)) * h2f(c);
  }
  return s;
}
/* eight 4-bit codes of one word, low nibble first (MatMulNBits' bytes: byte j holds k = 2j and 2j + 1)
   -> the half pairs (k0, k1) .. (k6, k7) of (code - zero) * scale: the differences exact, one rounding after.
   Byte j twice (__byte_perm), masked to k = 2j in the low half and 16 (2j + 1) in the high, over 1024's bits: one
   fma by (1, 1/16) takes 1024 + zero and 64 + zero off exactly */
__device__ __forceinline__ uint4 g_unpack8_q4(unsigned w, f16 scale, unsigned zero) {
  const unsigned scales = 0x2C003C00u;   /* halves (1, 1/16) */
  const unsigned lo = f2h(-1024.f - (float)zero), hi = f2h(-64.f - (float)zero);
  const unsigned bias = lo | (hi << 16), s2 = (unsigned)scale | ((unsigned)scale << 16);
  unsigned r[4];
  #pragma unroll
  for (int j = 0; j < 4; ++j) {
    unsigned q;
    const unsigned b = g_and_or(__byte_perm(w, 0u, 0x4040u | (0x0101u * j)), 0x00F0000Fu, 0x64006400u);
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(q) : "r"(b), "r"(scales), "r"(bias));
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r[j]) : "r"(q), "r"(s2));
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}
"""
PRELUDE = (TYPES + HALF_CONVERSIONS + COMMON + NARROW_CONVERSIONS + PREFETCH + DEPENDENT_LAUNCH + BLOCK_REDUCE
           + BLOCK_ARGREDUCE + NIBBLE_DOT)
