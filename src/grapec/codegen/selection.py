"""CUDA for the kernels whose output length depends on the data (ir/selection.py): NonZero's
compaction and NonMaxSuppression's greedy selection. Both write their selected rows first and -1
after them, so the count is an ordinary reduction and the rest of the graph stays static.

Both are written for any block width, down to the one thread a block the host emulation runs
(codegen/host.py): their loops stride by blockDim.x, and the block scan and arg-reduction fall back to
one thread's value there.

    nonzero  one block of 1024 threads walks the flags 1024 at a time: a block-wide exclusive scan
             gives each non-zero its column, a running base carries the columns between chunks.
             One block keeps the order without a second pass; it reads the flags once.
    nms      a block per (batch, class), 256 threads. The candidates are a bit set in shared memory;
             each round takes the best candidate (a block arg-reduction: the highest score, the
             lowest index among equals), writes it, and clears it and every candidate that overlaps
             it by IoU > threshold. The round count is the number selected. IoU is computed step by
             step in float32 with rounded intrinsics (no fused multiply-add), as onnxruntime does.
"""
from __future__ import annotations

import math

from ..ir.selection import NmsKernel, NonZeroKernel, TopKKernel
from .cuda import ctype
from .launch import Launch

NONZERO_BLOCK = 1024
NMS_BLOCK = 256
TOPK_BLOCK = 512
TOPK_SORT_BYTES = 40 * 1024   # a row this small (keys and indices) is sorted in shared memory

# A block-wide exclusive scan of one int a thread, and the block's total; every thread must call it.
_SCAN = r"""
__device__ __forceinline__ int {name}_scan(int x, int* total) {{
#ifdef __CUDA_ARCH__
  __shared__ int sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  int inc = x;
  for (int o = 1; o < 32; o <<= 1) {{ const int y = __shfl_up_sync(0xffffffffu, inc, o); if (lane >= o) inc += y; }}
  if (lane == 31) sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {{
    int w = lane < warps ? sums[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {{ const int y = __shfl_up_sync(0xffffffffu, w, o); if (lane >= o) w += y; }}
    sums[lane] = w;
  }}
  __syncthreads();
  const int before = inc - x + (warp ? sums[warp - 1] : 0);
  *total = sums[warps - 1];
  __syncthreads();   /* sums is read before the next call writes it */
  return before;
#else
  *total = x;
  return 0;
#endif
}}
"""


def selection_launch(k) -> Launch:
    if isinstance(k, NonZeroKernel):
        return Launch("row", 1, NONZERO_BLOCK, rows=1)
    if isinstance(k, TopKKernel):
        rows = math.prod(k.shape) // max(k.shape[k.axis], 1)
        return Launch("row", rows, TOPK_BLOCK, rows=rows)
    blocks = k.shape[0] * k.shape[1]
    return Launch("row", blocks, NMS_BLOCK, rows=blocks)


def render_selection(k, name: str) -> str:
    if isinstance(k, NonZeroKernel):
        return render_nonzero(k, name)
    return render_topk(k, name) if isinstance(k, TopKKernel) else render_nms(k, name)


def render_nonzero(k: NonZeroKernel, name: str) -> str:
    shape = k.inputs[0][0] or (1,)
    rank, numel = k.shape
    strides = [math.prod(shape[a + 1:]) for a in range(len(shape))]
    coords = "".join(f"      out[{a}LL * {numel}LL + col] = (i / {s}LL) % {d}LL;\n"
                     for a, (s, d) in enumerate(zip(strides, shape)))
    pads = "".join(f"    out[{a}LL * {numel}LL + col] = -1;\n" for a in range(rank))
    return (_SCAN.format(name=name) +
            f'extern "C" __global__ void __launch_bounds__({NONZERO_BLOCK}) {name}(i64* __restrict__ out, '
            f"const bool* __restrict__ in0) {{\n"
            f"  __shared__ i64 base;\n"
            f"  G_AWAIT_PREDECESSOR();\n"
            f"  if (threadIdx.x == 0) base = 0;\n"
            f"  __syncthreads();\n"
            f"  for (i64 start = 0; start < {numel}LL; start += blockDim.x) {{\n"
            f"    const i64 i = start + threadIdx.x;\n"
            f"    const int flag = (i < {numel}LL && in0[i]) ? 1 : 0;\n"
            f"    int total;\n"
            f"    const int before = {name}_scan(flag, &total);\n"
            f"    if (flag) {{\n"
            f"      const i64 col = base + before;\n"
            f"{coords}"
            f"    }}\n"
            f"    __syncthreads();\n"
            f"    if (threadIdx.x == 0) base += total;\n"
            f"    __syncthreads();\n"
            f"  }}\n"
            f"  for (i64 col = base + threadIdx.x; col < {numel}LL; col += blockDim.x) {{\n"
            f"{pads}"
            f"  }}\n"
            f"}}\n")


def render_nms(k: NmsKernel, name: str) -> str:
    batches, classes, bound = k.shape
    n = k.boxes
    words = max(1, (n + 31) // 32)
    if k.center_point_box:
        corners = ("  const float w1 = __fdiv_rn(b[2], 2.0f), h1 = __fdiv_rn(b[3], 2.0f);\n"
                   "  *xlo = __fsub_rn(b[0], w1); *xhi = __fadd_rn(b[0], w1);\n"
                   "  *ylo = __fsub_rn(b[1], h1); *yhi = __fadd_rn(b[1], h1);\n")
    else:
        corners = ("  *xlo = fminf(b[1], b[3]); *xhi = fmaxf(b[1], b[3]);\n"
                   "  *ylo = fminf(b[0], b[2]); *yhi = fmaxf(b[0], b[2]);\n")
    keep = "sc[i] > thr" if k.score_threshold else "true"
    return (
        f"__device__ __forceinline__ void {name}_corners(const float* b, float* xlo, float* xhi, float* ylo, float* yhi) {{\n"
        f"{corners}}}\n"
        f"/* onnxruntime's SuppressByIOU: selected box s against candidate c */\n"
        f"__device__ __forceinline__ bool {name}_overlaps(const float* boxes, i64 s, i64 c, float iou) {{\n"
        f"  float ax0, ax1, ay0, ay1, bx0, bx1, by0, by1;\n"
        f"  {name}_corners(boxes + 4 * s, &ax0, &ax1, &ay0, &ay1);\n"
        f"  {name}_corners(boxes + 4 * c, &bx0, &bx1, &by0, &by1);\n"
        f"  const float ix0 = fmaxf(ax0, bx0), ix1 = fminf(ax1, bx1);\n"
        f"  if (ix1 <= ix0) return false;\n"
        f"  const float iy0 = fmaxf(ay0, by0), iy1 = fminf(ay1, by1);\n"
        f"  if (iy1 <= iy0) return false;\n"
        f"  const float inter = __fmul_rn(__fsub_rn(ix1, ix0), __fsub_rn(iy1, iy0));\n"
        f"  if (inter <= 0.0f) return false;\n"
        f"  const float a1 = __fmul_rn(__fsub_rn(ax1, ax0), __fsub_rn(ay1, ay0));\n"
        f"  const float a2 = __fmul_rn(__fsub_rn(bx1, bx0), __fsub_rn(by1, by0));\n"
        f"  const float uni = __fsub_rn(__fadd_rn(a1, a2), inter);\n"
        f"  if (a1 <= 0.0f || a2 <= 0.0f || uni <= 0.0f) return false;\n"
        f"  return __fdiv_rn(inter, uni) > iou;\n"
        f"}}\n"
        f'extern "C" __global__ void __launch_bounds__({NMS_BLOCK}) {name}(i64* __restrict__ out, '
        f"const float* __restrict__ in0, const float* __restrict__ in1, const i64* __restrict__ in2, "
        f"const float* __restrict__ in3, const float* __restrict__ in4, const i64* __restrict__ in5) {{\n"
        f"  __shared__ unsigned int alive[{words}];\n"
        f"  const i64 bc = blockIdx.x, b = bc / {classes};\n"
        f"  const float* sc = in1 + bc * {n}LL;\n"
        f"  const float* boxes = in0 + b * {n * 4}LL;\n"
        f"  i64* o = out + bc * {bound}LL;\n"
        f"  G_AWAIT_PREDECESSOR();\n"
        f"  const i64 want = in2[0] < 0 ? 0 : (in2[0] > {bound}LL ? {bound}LL : in2[0]);\n"
        f"  const float iou = in3[0], thr = in4[0];\n"
        f"  const i64 valid = in5[0];\n"
        f"  for (int w = threadIdx.x; w < {words}; w += blockDim.x) {{\n"
        f"    unsigned int bits = 0u;\n"
        f"    for (int t = 0; t < 32; ++t) {{ const i64 i = (i64)w * 32 + t; if (i < {n}LL && i < valid && ({keep})) bits |= 1u << t; }}\n"
        f"    alive[w] = bits;\n"
        f"  }}\n"
        f"  for (i64 j = threadIdx.x; j < {bound}LL; j += blockDim.x) o[j] = -1;\n"
        f"  __syncthreads();\n"
        f"  for (i64 r = 0; r < want; ++r) {{\n"
        f"    float best = 0.0f;\n"
        f"    i64 at = -1;\n"
        f"    for (i64 i = threadIdx.x; i < {n}LL; i += blockDim.x)\n"
        f"      if ((alive[i >> 5] >> (i & 31)) & 1u) {{\n"
        f"        const float s = sc[i];\n"
        f"        if (at < 0 || s > best) {{ best = s; at = i; }}\n"
        f"      }}\n"
        f"    g_block_argreduce<float>(best, at, true, false);\n"
        f"    if (at < 0) break;\n"
        f"    if (threadIdx.x == 0) o[r] = at;\n"
        f"    for (i64 i = threadIdx.x; i < {n}LL; i += blockDim.x)\n"
        f"      if (((alive[i >> 5] >> (i & 31)) & 1u) && (i == at || {name}_overlaps(boxes, at, i, iou)))\n"
        f"        atomicAnd(&alive[i >> 5], ~(1u << (i & 31)));\n"
        f"    __syncthreads();\n"
        f"  }}\n"
        f"}}\n")


def topk_sorted_length(k: TopKKernel) -> int:
    """The power of two a row is padded to for the shared-memory sort; 0 where it does not fit."""
    dim = k.inputs[0][0][k.axis]
    p = 1 << max(dim - 1, 0).bit_length()
    return p if p * (8 + 4) <= TOPK_SORT_BYTES or p * (4 + 4) <= TOPK_SORT_BYTES and k.inputs[0][1] == "float32" else 0


def render_topk(k: TopKKernel, name: str) -> str:
    """A block per row. A row that fits shared memory is sorted there (bitonic, best first) and its first
    k written; a longer one takes k rounds of a block arg-reduction over what is not taken yet."""
    shape, key_t = k.inputs[0][0], ctype(k.inputs[0][1])
    dim, bound = shape[k.axis], k.shape[k.axis]
    inner = math.prod(shape[k.axis + 1:])
    floats = k.inputs[0][1] in ("float32", "float64")
    cmp = ">" if k.largest else "<"
    head = (f"/* a ranks before b: NaN last, then the {'larger' if k.largest else 'smaller'} key, then the lower index; -1 is padding */\n"
            f"__device__ __forceinline__ bool {name}_before({key_t} a, long long ia, {key_t} b, long long ib) {{\n"
            f"  if (ia < 0) return false;\n  if (ib < 0) return true;\n"
            f"  const bool na = {'a != a' if floats else 'false'}, nb = {'b != b' if floats else 'false'};\n"
            f"  if (na != nb) return nb;\n  if (!na && a != b) return a {cmp} b;\n  return ia < ib;\n}}\n")
    sig = (f'extern "C" __global__ void __launch_bounds__({TOPK_BLOCK}) {name}(i64* __restrict__ out, '
           f"const {key_t}* __restrict__ in0, const i64* __restrict__ in1) {{\n"
           f"  const i64 row = blockIdx.x, o = row / {inner}LL, i = row % {inner}LL;\n"
           f"  const {key_t}* x = in0 + o * {dim * inner}LL + i;\n"
           f"  i64* y = out + o * {bound * inner}LL + i;\n"
           f"  G_AWAIT_PREDECESSOR();\n"
           f"  const i64 want = in1[0] < 0 ? 0 : (in1[0] > {bound}LL ? {bound}LL : in1[0]);\n")
    p = topk_sorted_length(k)
    if p:
        body = (f"  __shared__ {key_t} keys[{p}];\n  __shared__ int at[{p}];\n"
                f"  for (int t = threadIdx.x; t < {p}; t += blockDim.x) {{\n"
                f"    at[t] = t < {dim} ? t : -1;\n    keys[t] = t < {dim} ? x[(i64)t * {inner}LL] : ({key_t})0;\n  }}\n"
                f"  for (int size = 2; size <= {p}; size <<= 1)\n"
                f"    for (int stride = size >> 1; stride > 0; stride >>= 1) {{\n"
                f"      __syncthreads();\n"
                f"      for (int t = threadIdx.x; t < {p // 2}; t += blockDim.x) {{\n"
                f"        const int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;\n"
                f"        const bool swap = (lo & size) == 0 ? {name}_before(keys[hi], at[hi], keys[lo], at[lo])\n"
                f"                                          : {name}_before(keys[lo], at[lo], keys[hi], at[hi]);\n"
                f"        if (swap) {{ const {key_t} kv = keys[lo]; keys[lo] = keys[hi]; keys[hi] = kv;\n"
                f"                    const int iv = at[lo]; at[lo] = at[hi]; at[hi] = iv; }}\n"
                f"      }}\n"
                f"    }}\n"
                f"  __syncthreads();\n"
                f"  for (i64 j = threadIdx.x; j < {bound}LL; j += blockDim.x) y[j * {inner}LL] = j < want ? (i64)at[j] : -1;\n}}\n")
        return head + sig + body
    words = (dim + 31) // 32
    body = (f"  __shared__ unsigned int taken[{words}];\n"
            f"  __shared__ {key_t} best_key[32];\n  __shared__ i64 best_at[32];\n"
            f"  for (int w = threadIdx.x; w < {words}; w += blockDim.x) taken[w] = 0u;\n"
            f"  for (i64 j = threadIdx.x; j < {bound}LL; j += blockDim.x) y[j * {inner}LL] = -1;\n"
            f"  __syncthreads();\n"
            f"  for (i64 r = 0; r < want; ++r) {{\n"
            f"    {key_t} bk = ({key_t})0;\n    i64 bi = -1;\n"
            f"    for (i64 t = threadIdx.x; t < {dim}LL; t += blockDim.x)\n"
            f"      if (!((taken[t >> 5] >> (t & 31)) & 1u)) {{ const {key_t} v = x[t * {inner}LL];\n"
            f"        if ({name}_before(v, t, bk, bi)) {{ bk = v; bi = t; }} }}\n"
            f"#ifdef __CUDA_ARCH__\n"
            f"    for (int s = 16; s > 0; s >>= 1) {{\n"
            f"      const {key_t} ok = __shfl_xor_sync(0xffffffffu, bk, s);\n"
            f"      const i64 oi = __shfl_xor_sync(0xffffffffu, bi, s);\n"
            f"      if ({name}_before(ok, oi, bk, bi)) {{ bk = ok; bi = oi; }}\n    }}\n"
            f"    if ((threadIdx.x & 31) == 0) {{ best_key[threadIdx.x >> 5] = bk; best_at[threadIdx.x >> 5] = bi; }}\n"
            f"    __syncthreads();\n"
            f"    bk = best_key[0]; bi = best_at[0];\n"
            f"    for (int w = 1; w < (int)(blockDim.x >> 5); ++w)\n"
            f"      if ({name}_before(best_key[w], best_at[w], bk, bi)) {{ bk = best_key[w]; bi = best_at[w]; }}\n"
            f"#endif\n"
            f"    if (bi < 0) break;\n"
            f"    if (threadIdx.x == 0) {{ y[r * {inner}LL] = bi; taken[bi >> 5] |= 1u << (bi & 31); }}\n"
            f"    __syncthreads();\n"
            f"  }}\n}}\n")
    return head + sig + body


__all__ = ["render_selection", "selection_launch", "topk_sorted_length"]
