"""CUDA for the kernels whose output length depends on the data (ir/selection.py): NonZero's
compaction and NonMaxSuppression's greedy selection. Both write their selected rows first and -1
after them, so the count is an ordinary reduction and the rest of the graph stays static.

Both are written for any block width, down to the one thread a block the host emulation runs
(codegen/host.py): their loops stride by blockDim.x, and the block scan and arg-reduction fall back to
one thread's value there.

    nonzero  one block of 1024 threads walks the flags 16K at a time, 16 a thread: a block-wide
             exclusive scan of the threads' counts gives each run its first column, a running base
             carries the columns between chunks.
             One block keeps the order without a second pass; it reads the flags once.
    nms      a block per (batch, class), 256 threads, over the candidates in score order (ranked by the
             TopK kernel first): a chunk of 256 at a time checked in parallel against the boxes kept
             so far and against each other, then kept in order by one thread (render_nms). IoU is
             computed step by step in float32 with rounded intrinsics (no fused multiply-add), as
             onnxruntime does.
    topk     a warp per element: its rank in its row, a sweep over the row (render_topk); a row of
             TOPK_SELECT_MIN_DIM or more, with at most TOPK_SELECT_MAX_K kept, by a block per row that
             finds the k-th key by radix select and ranks only the k keys before it (render_topk_select).
"""
from __future__ import annotations

import math

from ..ir.selection import TOPK_SELECT_MAX_K, NmsKernel, NmsMaskKernel, NonZeroKernel, TopKKernel
from .cuda import ctype
from .launch import Launch

NONZERO_BLOCK = 1024
NONZERO_ITEMS = 16   # flags a thread counts between two block scans
NMS_BLOCK = 256
NMS_MASK_BLOCK = 128
NMS_WALK_BLOCK = 1024
NMS_CACHED = 1024   # selected boxes whose corners stay in shared memory (16 KiB); later ones are read again
TOPK_BLOCK = 256
# Rows this long are ranked by selection: a row squared (RetinaNet's 1.3M scores of a level) is too much.
TOPK_SELECT_MIN_DIM = 4096
TOPK_SELECT_BLOCK = 1024

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
    if isinstance(k, NonZeroKernel):   # a block, or a block per segment
        blocks = -(-k.shape[1] // k.segment) if k.segment else 1
        return Launch("row", max(blocks, 1), NONZERO_BLOCK, rows=max(blocks, 1))
    if isinstance(k, NmsMaskKernel):   # a thread per mask word (its upper triangle: the rest return at once)
        total = math.prod(k.shape)
        return Launch("row", max(1, -(-total // NMS_MASK_BLOCK)), NMS_MASK_BLOCK, rows=max(total, 1))
    if isinstance(k, TopKKernel) and topk_selects(k):   # a block per row
        rows = math.prod(k.inputs[0][0]) // max(k.inputs[0][0][k.axis], 1)
        return Launch("row", max(rows, 1), TOPK_SELECT_BLOCK, rows=max(rows, 1))
    if isinstance(k, TopKKernel):   # a warp per input element (the host emulation: a block of one each)
        total = math.prod(k.inputs[0][0])
        return Launch("row", max(1, -(-total * 32 // TOPK_BLOCK)), TOPK_BLOCK, rows=max(total, 1))
    blocks = k.shape[0] * k.shape[1]
    return Launch("row", blocks, NMS_WALK_BLOCK if k.masked else NMS_BLOCK, rows=blocks)


def render_selection(k, name: str) -> str:
    if isinstance(k, NonZeroKernel):
        return render_nonzero(k, name)
    if isinstance(k, NmsMaskKernel):
        return render_nms_mask(k, name)
    if isinstance(k, NmsKernel) and k.masked:
        return render_nms_walk(k, name)
    if isinstance(k, TopKKernel):
        return render_topk_select(k, name) if topk_selects(k) else render_topk(k, name)
    return render_nms(k, name)


def topk_selects(k: TopKKernel) -> bool:
    """Whether a TopK's rows are long enough, and its bound small enough, for render_topk_select."""
    dim = k.inputs[0][0][k.axis]
    return TOPK_SELECT_MIN_DIM <= dim < 2 ** 31 and k.shape[k.axis] <= TOPK_SELECT_MAX_K


def render_nonzero(k: NonZeroKernel, name: str) -> str:
    """One block walks the flags NONZERO_ITEMS a thread at a time (a block scan per 16K flags, not per
    1024: the scan's barriers, not the reads, bound a long input); each thread writes the coordinates
    of its own run of flags in order."""
    shape = k.inputs[0][0] or (1,)
    rank, numel = k.shape
    strides = [math.prod(shape[a + 1:]) for a in range(len(shape))]
    coords = "".join(f"          out[{a}LL * {numel}LL + col] = (i / {s}LL) % {d}LL;\n"
                     for a, (s, d) in enumerate(zip(strides, shape)))
    pads = "".join(f"    out[{a}LL * {numel}LL + col] = -1;\n" for a in range(rank))
    items = NONZERO_ITEMS
    if k.segment:   # block b: the flags of segment b, from column in1[b]; the pads split between the blocks
        params, first_col, begin, end = ", const i64* __restrict__ in1", "in1[blockIdx.x]", \
            f"(i64)blockIdx.x * {k.segment}LL", f"((i64)blockIdx.x + 1) * {k.segment}LL < {numel}LL ? ((i64)blockIdx.x + 1) * {k.segment}LL : {numel}LL"
        blocks = -(-numel // k.segment)
        pad_from, pad_step = f"in1[{blocks}] + (i64)blockIdx.x * blockDim.x + threadIdx.x", f"{blocks}LL * blockDim.x"
    else:
        params, first_col, begin, end = "", "0", "0", f"{numel}LL"
        pad_from, pad_step = "base + threadIdx.x", "blockDim.x"
    return (_SCAN.format(name=name) +
            f'extern "C" __global__ void __launch_bounds__({NONZERO_BLOCK}) {name}(i64* __restrict__ out, '
            f"const bool* __restrict__ in0{params}) {{\n"
            f"  __shared__ i64 base;\n"
            f"  G_AWAIT_PREDECESSOR();\n"
            f"  if (threadIdx.x == 0) base = {first_col};\n"
            f"  __syncthreads();\n"
            f"  const i64 end = {end};\n"
            f"  for (i64 start = {begin}; start < end; start += (i64)blockDim.x * {items}) {{\n"
            f"    const i64 first = start + (i64)threadIdx.x * {items};\n"
            f"    int flags = 0;\n"
            f"    for (int t = 0; t < {items}; t++) flags += (first + t < end && in0[first + t]) ? 1 : 0;\n"
            f"    int total;\n"
            f"    const int before = {name}_scan(flags, &total);\n"
            f"    if (flags) {{\n"
            f"      i64 col = base + before;\n"
            f"      for (int t = 0; t < {items}; t++) {{\n"
            f"        const i64 i = first + t;\n"
            f"        if (i < end && in0[i]) {{\n"
            f"{coords}"
            f"          col++;\n"
            f"        }}\n"
            f"      }}\n"
            f"    }}\n"
            f"    __syncthreads();\n"
            f"    if (threadIdx.x == 0) base += total;\n"
            f"    __syncthreads();\n"
            f"  }}\n"
            f"  for (i64 col = {pad_from}; col < {numel}LL; col += {pad_step}) {{\n"
            f"{pads}"
            f"  }}\n"
            f"}}\n")


def _box_functions(center: int, name: str) -> str:
    """{name}_corners (a box as x0, x1, y0, y1) and {name}_overlaps (onnxruntime's SuppressByIOU)."""
    if center:
        corners = ("  const float w = __fdiv_rn(b[2], 2.0f), h = __fdiv_rn(b[3], 2.0f);\n"
                   "  c[0] = __fsub_rn(b[0], w); c[1] = __fadd_rn(b[0], w); c[2] = __fsub_rn(b[1], h); c[3] = __fadd_rn(b[1], h);\n")
    else:
        corners = "  c[0] = fminf(b[1], b[3]); c[1] = fmaxf(b[1], b[3]); c[2] = fminf(b[0], b[2]); c[3] = fmaxf(b[0], b[2]);\n"
    return (f"__device__ __forceinline__ void {name}_corners(const float* b, float* c) {{\n{corners}}}\n"
            f"/* onnxruntime's SuppressByIOU: a selected box (x0, x1, y0, y1) against a candidate */\n"
            f"__device__ __forceinline__ bool {name}_overlaps(const float* a, const float* b, float iou) {{\n"
            f"  const float ix0 = fmaxf(a[0], b[0]), ix1 = fminf(a[1], b[1]);\n"
            f"  if (ix1 <= ix0) return false;\n"
            f"  const float iy0 = fmaxf(a[2], b[2]), iy1 = fminf(a[3], b[3]);\n"
            f"  if (iy1 <= iy0) return false;\n"
            f"  const float inter = __fmul_rn(__fsub_rn(ix1, ix0), __fsub_rn(iy1, iy0));\n"
            f"  if (inter <= 0.0f) return false;\n"
            f"  const float a1 = __fmul_rn(__fsub_rn(a[1], a[0]), __fsub_rn(a[3], a[2]));\n"
            f"  const float a2 = __fmul_rn(__fsub_rn(b[1], b[0]), __fsub_rn(b[3], b[2]));\n"
            f"  const float uni = __fsub_rn(__fadd_rn(a1, a2), inter);\n"
            f"  if (a1 <= 0.0f || a2 <= 0.0f || uni <= 0.0f) return false;\n"
            f"  return __fdiv_rn(inter, uni) > iou;\n"
            f"}}\n")


def render_nms_mask(k: NmsMaskKernel, name: str) -> str:
    """A thread per word of the mask: candidate r's overlaps with the 64 candidates of word w (later ones)."""
    bcs, n, words = k.shape
    classes = k.inputs[1][0][1]
    return (_box_functions(k.center_point_box, name) +
            f'extern "C" __global__ void __launch_bounds__({NMS_MASK_BLOCK}) {name}(unsigned long long* __restrict__ out, '
            f"const float* __restrict__ in0, const i64* __restrict__ in1, const float* __restrict__ in2) {{\n"
            f"  const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"  G_AWAIT_PREDECESSOR();\n"
            f"  if (e >= {bcs * n * words}LL) return;\n"
            f"  const i64 w = e % {words}LL, r = (e / {words}LL) % {n}LL, bc = e / {n * words}LL;\n"
            f"  if (w < r / 64) return;   /* never read: earlier candidates */\n"
            f"  const i64* order = in1 + bc * {n}LL;\n"
            f"  const float* boxes = in0 + (bc / {classes}) * {n * 4}LL;\n"
            f"  const float iou = in2[0];\n"
            f"  float mine[4], theirs[4];\n"
            f"  {name}_corners(boxes + 4 * order[r], mine);\n"
            f"  unsigned long long bits = 0ull;\n"
            f"  for (int b = 0; b < 64; ++b) {{\n"
            f"    const i64 c = w * 64 + b;\n"
            f"    if (c <= r || c >= {n}LL) continue;\n"
            f"    {name}_corners(boxes + 4 * order[c], theirs);\n"
            f"    if ({name}_overlaps(mine, theirs, iou)) bits |= 1ull << b;\n"
            f"  }}\n"
            f"  out[e] = bits;\n"
            f"}}\n")


def render_nms_walk(k: NmsKernel, name: str) -> str:
    """Greedy NMS from the overlap mask (in7), a block per (batch, class): the candidates in score order 64
    at a time; one thread decides a word's 64 in order (kept unless removed: by an earlier kept one, or
    as no candidate at all), the block then removes what the word's kept ones overlap further on, a
    thread per (kept row, later word) so that the loads overlap."""
    batches, classes, bound = k.shape
    n = k.boxes
    words = (n + 63) // 64
    keep = "sc[order[r]] > thr" if k.score_threshold else "true"
    return (
        f'extern "C" __global__ void __launch_bounds__({NMS_WALK_BLOCK}) {name}(i64* __restrict__ out, '
        f"const float* __restrict__ in0, const float* __restrict__ in1, const i64* __restrict__ in2, "
        f"const float* __restrict__ in3, const float* __restrict__ in4, const i64* __restrict__ in5, "
        f"const i64* __restrict__ in6, const unsigned long long* __restrict__ in7) {{\n"
        f"  __shared__ unsigned long long removed[{words}];\n"
        f"  __shared__ int kept_rows[64];\n"
        f"  __shared__ unsigned long long diagonal[64];   /* the word's candidates' own mask words */\n"
        f"  __shared__ i64 ranked[64];\n"
        f"  __shared__ int kept_n;\n"
        f"  __shared__ i64 selected;\n"
        f"  const i64 bc = blockIdx.x;\n"
        f"  const float* sc = in1 + bc * {n}LL;\n"
        f"  const i64* order = in6 + bc * {n}LL;\n"
        f"  const unsigned long long* mask = in7 + bc * {n * words}LL;\n"
        f"  i64* o = out + bc * {bound}LL;\n"
        f"  G_AWAIT_PREDECESSOR();\n"
        f"  const i64 want = in2[0] < 0 ? 0 : (in2[0] > {bound}LL ? {bound}LL : in2[0]);\n"
        f"  const float thr = in4[0];\n"
        f"  const i64 valid = in5[0];\n"
        f"  const int t = threadIdx.x, width = blockDim.x;\n"
        f"  for (i64 j = t; j < {bound}LL; j += width) o[j] = -1;\n"
        f"  for (int w = t; w < {words}; w += width) {{   /* no candidate: padding, or a score not above the threshold */\n"
        f"    unsigned long long bits = 0ull;\n"
        f"    for (int b = 0; b < 64; ++b) {{ const i64 r = (i64)w * 64 + b;\n"
        f"      if (r >= {n}LL || order[r] < 0 || order[r] >= valid || !({keep})) bits |= 1ull << b; }}\n"
        f"    removed[w] = bits;\n"
        f"  }}\n"
        f"  if (t == 0) selected = 0;\n"
        f"  __syncthreads();\n"
        f"  for (int g = 0; g < {words} && selected < want; ++g) {{\n"
        f"    for (int b = t; b < 64; b += width) {{   /* loaded together: the walk below reads no global memory */\n"
        f"      const i64 r = (i64)g * 64 + b;\n"
        f"      diagonal[b] = r < {n}LL ? mask[r * {words}LL + g] : 0ull;\n"
        f"      ranked[b] = r < {n}LL ? order[r] : -1;\n"
        f"    }}\n"
        f"    __syncthreads();\n"
        f"    if (t == 0) {{\n"
        f"      unsigned long long word = removed[g];\n"
        f"      int kn = 0;\n"
        f"      i64 count = selected;\n"
        f"      for (int b = 0; b < 64 && count < want; ++b) {{\n"
        f"        if ((word >> b) & 1ull) continue;\n"
        f"        o[count++] = ranked[b];\n"
        f"        kept_rows[kn++] = g * 64 + b;\n"
        f"        word |= diagonal[b];\n"
        f"      }}\n"
        f"      kept_n = kn;\n"
        f"      selected = count;\n"
        f"    }}\n"
        f"    __syncthreads();\n"
        f"    const int rest = {words} - g - 1, pairs = kept_n * rest;   /* (kept row, later word): loads in flight together */\n"
        f"    for (int p = t; p < pairs; p += width) {{\n"
        f"      const int q = p / rest, w = g + 1 + p % rest;\n"
        f"      const unsigned long long bits = mask[(i64)kept_rows[q] * {words}LL + w];\n"
        f"      if (bits) atomicOr(&removed[w], bits);\n"
        f"    }}\n"
        f"    __syncthreads();\n"
        f"  }}\n"
        f"}}\n")


def render_nms(k: NmsKernel, name: str) -> str:
    """Greedy NMS over the candidates in score order (in6: each (batch, class)'s boxes ranked by the TopK
    kernel), a chunk of a block's width at a time: each thread checks its candidate against the boxes
    selected so far (the first NMS_CACHED of them kept in shared memory), then marks which earlier
    candidates of the chunk overlap it; one thread walks the chunk in order and keeps a candidate that
    no kept one overlaps. That is the greedy rule exactly, with the work spread over the block."""
    batches, classes, bound = k.shape
    n = k.boxes
    keep = "sc[cand] > thr" if k.score_threshold else "true"
    words = NMS_BLOCK // 32
    return (
        _box_functions(k.center_point_box, name) +
        f'extern "C" __global__ void __launch_bounds__({NMS_BLOCK}) {name}(i64* __restrict__ out, '
        f"const float* __restrict__ in0, const float* __restrict__ in1, const i64* __restrict__ in2, "
        f"const float* __restrict__ in3, const float* __restrict__ in4, const i64* __restrict__ in5, "
        f"const i64* __restrict__ in6) {{\n"
        f"  __shared__ i64 chunk[{NMS_BLOCK}];\n"
        f"  __shared__ unsigned int overlap[{NMS_BLOCK}][{words}];\n"
        f"  __shared__ float cached[{NMS_CACHED}][4];\n"
        f"  __shared__ i64 selected;\n"
        f"  __shared__ int done;\n"
        f"  const i64 bc = blockIdx.x, b = bc / {classes};\n"
        f"  const float* sc = in1 + bc * {n}LL;\n"
        f"  const float* boxes = in0 + b * {n * 4}LL;\n"
        f"  const i64* order = in6 + bc * {n}LL;\n"
        f"  i64* o = out + bc * {bound}LL;\n"
        f"  G_AWAIT_PREDECESSOR();\n"
        f"  const i64 want = in2[0] < 0 ? 0 : (in2[0] > {bound}LL ? {bound}LL : in2[0]);\n"
        f"  const float iou = in3[0], thr = in4[0];\n"
        f"  const i64 valid = in5[0];\n"
        f"  const int t = threadIdx.x, width = blockDim.x;\n"
        f"  for (i64 j = t; j < {bound}LL; j += width) o[j] = -1;\n"
        f"  if (t == 0) {{ selected = 0; done = want == 0; }}\n"
        f"  __syncthreads();\n"
        f"  for (i64 base = 0; base < {n}LL && !done; base += width) {{\n"
        f"    const i64 cand = base + t < {n}LL ? order[base + t] : -1;\n"
        f"    bool ok = cand >= 0 && cand < valid && ({keep});\n"
        f"    float mine[4];\n"
        f"    if (ok) {{\n"
        f"      {name}_corners(boxes + 4 * cand, mine);\n"
        f"      const i64 upto = selected;\n"
        f"      for (i64 s = 0; s < upto && ok; ++s) {{\n"
        f"        float theirs[4];\n"
        f"        if (s < {NMS_CACHED}) {{ theirs[0] = cached[s][0]; theirs[1] = cached[s][1]; theirs[2] = cached[s][2]; theirs[3] = cached[s][3]; }}\n"
        f"        else {name}_corners(boxes + 4 * o[s], theirs);\n"
        f"        if ({name}_overlaps(theirs, mine, iou)) ok = false;\n"
        f"      }}\n"
        f"    }}\n"
        f"    chunk[t] = ok ? cand : -1;\n"
        f"    __syncthreads();\n"
        f"    for (int w = 0; w < (width + 31) / 32; ++w) {{\n"
        f"      unsigned int bits = 0u;\n"
        f"      for (int u = w * 32; u < w * 32 + 32 && u < t; ++u)\n"
        f"        if (ok && chunk[u] >= 0) {{ float theirs[4]; {name}_corners(boxes + 4 * chunk[u], theirs);\n"
        f"          if ({name}_overlaps(theirs, mine, iou)) bits |= 1u << (u - w * 32); }}\n"
        f"      overlap[t][w] = bits;\n"
        f"    }}\n"
        f"    __syncthreads();\n"
        f"    if (t == 0) {{   /* the chunk in score order: kept unless a kept one overlaps it */\n"
        f"      unsigned int kept[{words}];\n"
        f"      for (int w = 0; w < {words}; ++w) kept[w] = 0u;\n"
        f"      i64 count = selected;\n"
        f"      for (int u = 0; u < width && count < want; ++u) {{\n"
        f"        if (chunk[u] < 0) continue;\n"
        f"        bool hit = false;\n"
        f"        for (int w = 0; w < (width + 31) / 32; ++w) hit = hit || (overlap[u][w] & kept[w]) != 0u;\n"
        f"        if (hit) continue;\n"
        f"        kept[u >> 5] |= 1u << (u & 31);\n"
        f"        if (count < {NMS_CACHED}) {name}_corners(boxes + 4 * chunk[u], cached[count]);\n"
        f"        o[count++] = chunk[u];\n"
        f"      }}\n"
        f"      selected = count;\n"
        f"      done = count >= want;\n"
        f"    }}\n"
        f"    __syncthreads();\n"
        f"  }}\n"
        f"}}\n")


def render_topk(k: TopKKernel, name: str) -> str:
    """A warp per element: its rank is the number of elements of its row that rank before it (the lanes
    sweep the row between them and sum), and ranks below the bound write
    the element's index there (or -1 from k on). Equal keys rank by index, so the ranks are a
    permutation and every position below the bound is written once. The work is a row's length
    squared, spread over the whole GPU: no sort state to keep, however long the row."""
    shape, key_t = k.inputs[0][0], ctype(k.inputs[0][1])
    dim, bound = shape[k.axis], k.shape[k.axis]
    inner = math.prod(shape[k.axis + 1:])
    total = math.prod(shape)
    floats = k.inputs[0][1] in ("float32", "float64")
    cmp = ">" if k.largest else "<"
    return (f"/* a ranks before b: NaN last, then the {'larger' if k.largest else 'smaller'} key, then the lower index */\n"
            f"__device__ __forceinline__ bool {name}_before({key_t} a, long long ia, {key_t} b, long long ib) {{\n"
            f"  const bool na = {'a != a' if floats else 'false'}, nb = {'b != b' if floats else 'false'};\n"
            f"  if (na != nb) return nb;\n  if (!na && a != b) return a {cmp} b;\n  return ia < ib;\n}}\n"
            f'extern "C" __global__ void __launch_bounds__({TOPK_BLOCK}) {name}(i64* __restrict__ out, '
            f"const {key_t}* __restrict__ in0, const i64* __restrict__ in1) {{\n"
            f"  const int lanes = blockDim.x >= 32 ? 32 : 1, lane = threadIdx.x % lanes;   /* a warp per element */\n"
            f"  const i64 e = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / lanes;\n"
            f"  G_AWAIT_PREDECESSOR();\n"
            f"  if (e >= {total}LL) return;\n"
            f"  const i64 i = (e / {inner}LL) % {dim}LL, o = e / {dim * inner}LL, in = e % {inner}LL;\n"
            f"  const {key_t}* x = in0 + o * {dim * inner}LL + in;\n"
            f"  const {key_t} mine = x[i * {inner}LL];\n"
            f"  long long rank = 0;\n"
            f"  for (i64 j = lane; j < {dim}LL; j += lanes) rank += {name}_before(x[j * {inner}LL], j, mine, i) ? 1 : 0;\n"
            f"#ifdef __CUDA_ARCH__\n"
            f"  for (int s = 16; s > 0; s >>= 1) rank += __shfl_xor_sync(0xffffffffu, rank, s);\n"
            f"#endif\n"
            f"  if (lane != 0 || rank >= {bound}LL) return;\n"
            f"  const i64 want = in1[0] < 0 ? 0 : in1[0];\n"
            f"  out[o * {bound * inner}LL + rank * {inner}LL + in] = rank < want ? i : -1;\n"
            f"}}\n")


def _order_key(k: TopKKernel, name: str) -> tuple:
    """(unsigned type, its bits, a device function mapping a key to it): the smaller the mapped key, the
    sooner the element ranks, as {name}_before orders them (NaN last, -0 with +0, then by value)."""
    dt = k.inputs[0][1]
    u, bits = ("unsigned int", 32) if dt == "float32" else ("unsigned long long", 64)
    flip = "~b" if k.largest else "b"
    if dt in ("float32", "float64"):
        cast = "__float_as_uint(v)" if dt == "float32" else "(unsigned long long)__double_as_longlong(v)"
        top = f"(({u})1 << {bits - 1})"
        body = (f"  if (v != v) return ~({u})0;\n  if (v == 0) v = 0;\n  {u} b = {cast};\n"
                f"  b = (b & {top}) ? ~b : (b | {top});\n  return {flip};\n")
    elif dt == "int64":
        body = f"  const {u} b = ({u})v ^ (1ULL << 63);\n  return {flip};\n"
    else:
        body = f"  const {u} b = ({u})v;\n  return {flip};\n"
    fn = f"__device__ __forceinline__ {u} {name}_ord({ctype(dt)} v) {{\n{body}}}\n"
    return u, bits, fn


def _radix_pass(name: str, u: str, value: str, keep: str) -> str:
    """One 8-bit digit of a radix select, every thread of the block calling it: the histogram of the
    digit at `shift` of `value` over the elements where `keep`, then the digit whose bin holds the
    need-th, the prefix and need narrowed to it (shared: prefix_s, need_s, eq_s)."""
    return (f"      __syncthreads();\n"
            f"      for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;\n"
            f"      __syncthreads();\n"
            f"      for (i64 j = threadIdx.x; j < dim; j += blockDim.x) {{\n"
            f"        const {u} u = {name}_ord(x[j * inner]);\n"
            f"        const unsigned d = (unsigned)(({value} >> shift) & 255);\n"
            f"        if ({keep}) {name}_count(hist, d);\n"
            f"      }}\n"
            f"      __syncthreads();\n"
            f"      if (threadIdx.x == 0) {{\n"
            f"        long long c = 0; int b = 0;\n"
            f"        for (; b < 255 && c + hist[b] < need_s; b++) c += hist[b];\n"
            f"        prefix_s |= (unsigned long long)b << shift; need_s -= c; eq_s = hist[b];\n"
            f"      }}\n"
            f"      __syncthreads();\n")


def render_topk_select(k: TopKKernel, name: str) -> str:
    """A block per row: a radix select finds T, the order key of the k-th element (8 bits a pass over
    the row, a 256-bin histogram in shared memory, counts aggregated per warp), and, where more
    elements equal T than are needed, a second select over their indices keeps the lowest. The k
    elements before that cut are gathered into shared memory and each ranked among them only: the
    row is read a few times instead of compared with itself. Equal keys rank by index, as in
    render_topk, and positions from k to the bound are -1."""
    shape = k.inputs[0][0]
    dim, bound = shape[k.axis], k.shape[k.axis]
    inner = math.prod(shape[k.axis + 1:])
    u, bits, ord_fn = _order_key(k, name)
    ibits = max(8, (dim - 1).bit_length())
    count = (f"__device__ __forceinline__ void {name}_count(unsigned* hist, unsigned d) {{\n"
             f"#ifdef __CUDA_ARCH__\n"
             f"  const unsigned same = __match_any_sync(__activemask(), d);   /* one atomic per digit a warp */\n"
             f"  if ((threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&hist[d], (unsigned)__popc(same));\n"
             f"#else\n  hist[d] += 1;\n#endif\n}}\n")
    return (ord_fn + count +
            f'extern "C" __global__ void __launch_bounds__({TOPK_SELECT_BLOCK}) {name}(i64* __restrict__ out, '
            f"const {ctype(k.inputs[0][1])}* __restrict__ in0, const i64* __restrict__ in1) {{\n"
            f"  __shared__ unsigned hist[256];\n"
            f"  __shared__ unsigned long long prefix_s;\n"
            f"  __shared__ long long need_s, eq_s;\n"
            f"  __shared__ int taken_s;\n"
            f"  __shared__ {u} kept_key[{bound}];\n"
            f"  __shared__ int kept_index[{bound}];\n"
            f"  const i64 dim = {dim}LL, inner = {inner}LL;\n"
            f"  const i64 o = blockIdx.x / inner, in = blockIdx.x % inner;\n"
            f"  const {ctype(k.inputs[0][1])}* x = in0 + o * dim * inner + in;\n"
            f"  i64* y = out + o * {bound}LL * inner + in;\n"
            f"  G_AWAIT_PREDECESSOR();\n"
            f"  const i64 want = in1[0] < 0 ? 0 : (in1[0] < {bound}LL ? in1[0] : {bound}LL);\n"
            f"  const int kk = (int)want;\n"
            f"  if (kk > 0) {{\n"
            f"    if (threadIdx.x == 0) {{ prefix_s = 0; need_s = kk; }}\n"
            f"    {u} mask = 0;\n"
            f"    for (int shift = {bits - 8}; shift >= 0; shift -= 8) {{   /* T, the k-th order key */\n"
            + _radix_pass(name, u, "u", f"(u & mask) == ({u})prefix_s") +
            f"      mask |= ({u})255 << shift;\n"
            f"    }}\n"
            f"    const {u} t = ({u})prefix_s;\n"
            f"    i64 cut = dim;   /* elements equal to T are kept where their index is below cut */\n"
            f"    if (eq_s > need_s) {{   /* more equal T than needed: the lowest indices, by a select over them */\n"
            f"      __syncthreads();\n"
            f"      if (threadIdx.x == 0) prefix_s = 0;\n"
            f"      unsigned long long imask = 0;\n"
            f"      for (int shift = {(ibits - 1) // 8 * 8}; shift >= 0; shift -= 8) {{\n"
            + _radix_pass(name, u, "(unsigned long long)j", "u == t && ((unsigned long long)j & imask) == prefix_s") +
            f"        imask |= 255ULL << shift;\n"
            f"      }}\n"
            f"      cut = (i64)prefix_s + 1;\n"
            f"    }}\n"
            f"    __syncthreads();\n"
            f"    if (threadIdx.x == 0) taken_s = 0;\n"
            f"    __syncthreads();\n"
            f"    for (i64 j = threadIdx.x; j < dim; j += blockDim.x) {{   /* exactly k are kept */\n"
            f"      const {u} u = {name}_ord(x[j * inner]);\n"
            f"      if (u < t || (u == t && j < cut)) {{ const int s = atomicAdd(&taken_s, 1); kept_key[s] = u; kept_index[s] = (int)j; }}\n"
            f"    }}\n"
            f"    __syncthreads();\n"
            f"    for (int c = threadIdx.x; c < kk; c += blockDim.x) {{   /* rank among the kept: key, then index */\n"
            f"      const {u} mine = kept_key[c]; const int at = kept_index[c];\n"
            f"      int r = 0;\n"
            f"      for (int d = 0; d < kk; d++) r += (kept_key[d] < mine || (kept_key[d] == mine && kept_index[d] < at)) ? 1 : 0;\n"
            f"      y[r * inner] = at;\n"
            f"    }}\n"
            f"  }}\n"
            f"  for (i64 r = kk + threadIdx.x; r < {bound}LL; r += blockDim.x) y[r * inner] = -1;\n"
            f"}}\n")


__all__ = ["render_selection", "selection_launch", "topk_selects"]
