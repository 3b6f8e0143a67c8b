"""SmallGemmKernel -> one CUDA kernel on fp16/bf16 tensor cores (mma.sync m16n8k16).

A block of WARPS warps:
  1. issues its first weight tile's loads, then (with a prologue) stages A's M rows (at most 16) in
     shared memory, each warp computing whole rows of the prologue (a LayerNorm: warp reductions,
     16-byte loads; rendered from kernel IR) while the weights arrive; without one, A is read
     where it lies;
  2. walks column tiles of 8 (grid-stride over the tiles, so that a long N reuses the staged rows):
     its warps split into `col_tiles` tiles side by side times `k_slices` slices of K. Each lane
     issues all its weight loads for the tile first (16 bytes = 8 consecutive k of one weight row),
     then feeds the tensor cores, then issues the next tile's loads. The mma only needs lanes to agree on which k they multiply, not
     on the order: lane (g, t) holds k = 8t..8t+7 of a 32-wide step, and passes 8t, 8t+1 / 8t+2,
     8t+3 where the fragment layout says 2t, 2t+1 / 2t+8, 2t+9 (then 8t+4.. in a second mma), for
     A and W alike. A's rows g and g+8 are the fragment's rows; rows past M are zeros;
  3. adds the k slices' partial tiles through shared memory and applies the epilogue (bias,
     activation, residual; rendered from kernel IR) as the results are stored.

More rows (17..MAX_SPLIT_ROWS: a transformer at seq 128, a late convolution's pixels) take the split
form (render_split_gemm): every warp multiplies all of A's row tiles by its weight registers, so a
weight is read once whatever M is; a block is 8 column tiles, and a cluster of `splits` blocks
(Hopper's thread-block clusters) divides K between them. Each block keeps its partial tile in shared
memory; after a cluster barrier every block sums one share of the tile across the cluster's shared
memories (distributed shared memory), applies the epilogue and stores it. One kernel, no workspace:
cuBLASLt at M = 128 and N = 768 makes 12 tiles of 64x128 that walk K = 3072 serially on 12 SMs
(6.8 us for 4.7 MB of weights, H100), or splits K with a second kernel. So far the split form is the
slower one at every shape measured (11.2 us there; benchmarks/results/2026-11-26-h100-split-gemm), so
passes/small_gemm.py takes it only where a cost model prices it cheaper, which the shipped one does not.

A packed weight (MatMulNBits' 4-bit codes, unpacked as they load) with A read as it lies takes the staged
split form (render_staged_split) at any row count up to 16, and so do half weights at 2-16 rows: the one-tile form read A again for every 8
columns, 8 times the codes' bytes at 16 rows (an int4 Llama-1B down projection at 16 rows: 62.9 us for 8 MiB
of codes, 12.2 us in the packed split form; H200, benchmarks/results/2026-11-29-h200-s61).

Fragment layouts (PTX ISA, mma.m16n8k16): g = lane / 4, t = lane % 4.
    A (16x16): a0a1 (g, 2t..2t+1)  a2a3 (g+8, 2t..)  a4a5 (g, 2t+8..)  a6a7 (g+8, 2t+8..)
    B (16x8):  b0b1 (k = 2t..2t+1, n = g)  b2b3 (k = 2t+8.., n = g)
    C (16x8):  c0c1 (g, 2t..2t+1)  c2c3 (g+8, 2t..2t+1)
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..ir.small_gemm import SmallGemmKernel
from .cuda import RowFunctionRenderer, ValueFunctionRenderer, ctype
from .launch import Launch

SMS = 132              # H100/H200 SMs
WARPS = 8
MAX_STEPS = 16         # 32-wide k steps a lane holds in flight (4 registers each)
BLOCKS_PER_SM = 2      # a long N loops over tiles in a grid of this many blocks per SM
MAX_ROWS = 16          # one mma tile of rows: the one-tile form (and a prologue) up to here
MAX_SPLIT_ROWS = 128   # the split form's row tiles (8 of them: 32 accumulators a lane)
MAX_SPLITS = 8         # blocks of a cluster (the portable cluster size)
SPLIT_COL_TILES = 8    # a split block's warps, one column tile each
MAX_SPLIT_STEPS = 24   # the split form's k steps a lane holds (no k slices share its block's registers)
MAX_PACKED_SPLIT_STEPS = 40   # the staged split form's (render_staged_split) steps of packed codes: 2 registers a
#                               step (the word, its scale and zero point); a block stages its share of A whole:
#                               16 rows of 40 steps are 41 KB
MAX_STAGED_HALF_STEPS = 32    # ... of half weights: 4 registers a step
# the k that lane t multiplies at step s of a block whose share of K starts at k0, in render_staged_split: in quad
# s / 4 the lane holds 32 consecutive k, 8 a step (C and Python alike: tests evaluate it)
STAGED_K = "(s >> 2) * 128 + 32 * t + 8 * (s & 3)"
SPLIT_RING = 4         # the split form's stages of A in shared memory: 3 steps' copies in flight
SMEM_BYTES = 40 * 1024  # a prologue's staged rows, under the 48 KB a block gets without opting in


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class SmallGemmTiling:
    col_tiles: int     # 8-column tiles a block computes side by side
    k_slices: int      # warps that split one tile's K
    steps: int         # 32-wide k steps per warp and tile
    block_tiles: int   # groups of col_tiles tiles, walked by the grid
    grid: int
    lda: int           # the staged rows' stride in elements: 64 bytes past a multiple of 128, so
    #                    that the 8 rows one load instruction touches fall in distinct banks
    splits: int = 1    # the split form: blocks of a cluster that share one column group's K
    row_tiles: int = 1  # the split form: A's 16-row tiles every warp multiplies

    @property
    def block(self) -> int:
        return 32 * self.col_tiles * self.k_slices


def lda_for(depth: int) -> int:
    return depth + ((64 - 2 * depth % 128) % 128) // 2


def staged_bytes(rows: int, depth: int) -> int:
    return 2 * rows * lda_for(depth)


def is_split(k: SmallGemmKernel) -> bool:
    """The split form: past one mma tile of rows, or where the pass chose it for a packed weight without a
    prologue (the one-tile form reads A again for every 8 columns, from L1 or L2: 8 times the codes' bytes at
    16 rows; the split form stages A once for a block's 64 columns)."""
    return k.rows > MAX_ROWS or k.split


def small_gemm_tiling(k: SmallGemmKernel) -> SmallGemmTiling:
    n_tiles, k_steps = _ceil(k.cols, 8), _ceil(k.depth, 32)
    if is_split(k) and k.rows <= MAX_ROWS:   # whole quads of steps (render_staged_split)
        t = split_tiling(n_tiles, k_steps, 1, lda_for(k.depth), _staged_steps(k.packed is not None))
        return replace(t, steps=_ceil(t.steps, 4) * 4)
    if is_split(k):
        return split_tiling(n_tiles, k_steps, _ceil(k.rows, 16), lda_for(k.depth))
    col_tiles = 1
    while col_tiles < WARPS and _ceil(n_tiles, 2 * col_tiles) >= SMS:
        col_tiles *= 2
    while True:
        k_slices = min(WARPS // col_tiles, k_steps)
        steps = _ceil(k_steps, k_slices)
        if steps <= MAX_STEPS or col_tiles == 1:
            break
        col_tiles //= 2
    block_tiles = _ceil(n_tiles, col_tiles)
    return SmallGemmTiling(col_tiles, k_slices, steps, block_tiles, min(block_tiles, SMS * BLOCKS_PER_SM),
                           lda_for(k.depth))


def split_tiling(n_tiles: int, k_steps: int, row_tiles: int, lda: int, max_steps: int = MAX_SPLIT_STEPS) -> SmallGemmTiling:
    """The split form: the fewest splits that hold a warp's share of K in registers (max_steps), then more
    while the grid leaves SMs idle and each split keeps a step."""
    col_tiles = min(SPLIT_COL_TILES, n_tiles)
    groups = _ceil(n_tiles, col_tiles)
    splits = 1
    while splits < MAX_SPLITS and (_ceil(k_steps, splits) > max_steps
                                   or (groups * splits < SMS and 2 * splits <= k_steps)):
        splits *= 2
    return SmallGemmTiling(col_tiles, 1, _ceil(k_steps, splits), groups, groups * splits, lda, splits, row_tiles)


def fits_split(rows: int, depth: int) -> bool:
    """Can the split form take this GEMM: its rows in 8 tiles, a warp's share of K in registers."""
    return rows <= MAX_SPLIT_ROWS and _ceil(_ceil(depth, 32), MAX_SPLITS) <= MAX_SPLIT_STEPS


def _staged_steps(packed: bool) -> int:
    return MAX_PACKED_SPLIT_STEPS if packed else MAX_STAGED_HALF_STEPS


def fits_staged_split(rows: int, depth: int, packed: bool) -> bool:
    """Can the staged split form (render_staged_split) take this GEMM: one mma tile of rows, a warp's share of K
    (whole quads of steps) in registers and the block's share of A in shared memory."""
    return rows <= MAX_ROWS and _ceil(_ceil(_ceil(depth, 32), MAX_SPLITS), 4) * 4 <= _staged_steps(packed)


def small_gemm_launch(k: SmallGemmKernel) -> Launch:
    t = small_gemm_tiling(k)
    return Launch("small_gemm", t.grid, t.block)


def render_small_gemm(k: SmallGemmKernel, name: str) -> str:
    """-> CUDA C for the kernel (its prologue and epilogue functions first), named `name`."""
    t = small_gemm_tiling(k)
    if is_split(k) and k.rows <= MAX_ROWS:
        return render_staged_split(k, t, name)
    if is_split(k):
        return render_split_gemm(k, t, name)
    ty = ctype(k.dtype)
    mma = "f16" if k.dtype == "float16" else "bf16"
    store = "f2h" if k.dtype == "float16" else "f2b"
    m, n, depth, lda, p = k.rows, k.cols, k.depth, t.lda, k.a_slots
    L = []
    if k.prologue is not None:
        L += [RowFunctionRenderer(k.prologue, m, depth).render_function(f"{name}_prologue"), ""]
    staged = staged_rows(m, depth)
    L += [ValueFunctionRenderer(k.epilogue).render_function(f"{name}_epilogue"), ""]
    params = [f"{ty}* __restrict__ out"] + [f"const {ctype(dt)}* __restrict__ in{i}" for i, (_, dt) in enumerate(k.inputs)]
    # the grid is BLOCKS_PER_SM blocks an SM: a packed weight's kernel of 4 rows and 16 steps, its codes unpacked
    # beside A's loads in flight, took 161 registers a thread unbounded (one block an SM), 123 and no spills when
    # bounded (ptxas, sm_90). With A's second 8 rows or 32 steps, bounded, it spilled 0.3-1.8 KB a thread: those
    # keep one block an SM, as half weights' do (237 registers at 16 rows and 32 steps)
    bounded = k.packed is not None and t.steps <= MAX_STEPS and k.rows <= 8
    bounds = f"{t.block}, {BLOCKS_PER_SM}" if bounded else f"{t.block}"
    L.append(f'extern "C" __global__ void __launch_bounds__({bounds}) {name}({", ".join(params)}) {{')
    if t.k_slices > 1:
        L.append(f"  __shared__ float g_part[{(t.k_slices - 1) * t.col_tiles * 128}];   /* partial tiles of slices 1.. */")
    L.append(f"  const int {ROWS} = {m};   /* A's rows: the one number that differs between sizes (one_tile_group) */")
    L.append("  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;")
    L.append(f"  const int ct = warp % {t.col_tiles}, ks = warp / {t.col_tiles};")
    L.append("  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);")
    L += _declare_weights(k, t)
    L.append("  int bt = blockIdx.x;")
    L.append("  /* the weights wait for nothing: the first tile's loads fly while the kernel before ends and A's rows are made */")
    L += _load_weights(k, t, p, "bt", "  ")
    L.append("  G_AWAIT_PREDECESSOR();   /* A comes from the kernel before */")
    if k.prologue is not None:
        args = "".join(f", in{i}" for i in range(p))
        L.append(f"  __shared__ __align__(16) {ty} g_a[{staged * lda}];   /* A's rows, stride {lda} */")
        L.append(f"  for (int r = warp; r < {ROWS}; r += {t.block // 32}) {name}_prologue(g_a + r * {lda}, r, lane{args});")
        L.append("  __syncthreads();")
        a_rows, a_ld = "g_a", lda
    else:   # A is read where it lies (L1 and L2 serve the blocks after the first)
        a_rows, a_ld = "in0", depth
    L.append(f"  for (; bt < {t.block_tiles}; bt += gridDim.x) {{")
    L.append(f"    const i64 n0 = ((i64)bt * {t.col_tiles} + ct) * 8;")
    L.append("    float c[4] = {0.f, 0.f, 0.f, 0.f};")
    L.append("    #pragma unroll")
    L.append(f"    for (int s = 0; s < {t.steps}; ++s) {{")
    L.append(f"      const int kk = (ks * {t.steps} + s) * 32 + 8 * t;")
    L.append(f"      const uint4 lo = (g < {ROWS} && kk < {depth}) ? *(const uint4*)({a_rows} + g * {a_ld} + kk) : zero;")
    L.append(f"      const uint4 hi = (g + 8 < {ROWS} && kk < {depth}) ? *(const uint4*)({a_rows} + (g + 8) * {a_ld} + kk) : zero;")
    L.append(_step_weights(k, "      "))
    L.append(f'      G_MMA("{mma}", c, lo.x, hi.x, lo.y, hi.y, ws.x, ws.y);')
    L.append(f'      G_MMA("{mma}", c, lo.z, hi.z, lo.w, hi.w, ws.z, ws.w);')
    L.append("    }")
    L.append("    /* the next tile's weights fly while this one is summed and stored */")
    L += _load_weights(k, t, p, "bt + (int)gridDim.x", "    ")
    if t.k_slices > 1:
        L.append(f"    if (ks > 0) *(float4*)(g_part + ((ks - 1) * {t.col_tiles} + ct) * 128 + lane * 4) = make_float4(c[0], c[1], c[2], c[3]);")
        L.append("    __syncthreads();")
        L.append("    if (ks == 0) {")
        L.append(f"      for (int j = 0; j < {t.k_slices - 1}; ++j) {{")
        L.append(f"        const float4 q = *(const float4*)(g_part + (j * {t.col_tiles} + ct) * 128 + lane * 4);")
        L.append("        c[0] += q.x; c[1] += q.y; c[2] += q.z; c[3] += q.w;")
        L.append("      }")
        L.append("    }")
        L.append("    __syncthreads();   /* the next tile's partials wait until these are read */")
    extras = _epilogue_args(k)
    L.append("    if (ks == 0) {")
    L.append("      #pragma unroll")
    L.append("      for (int h = 0; h < 4; ++h) {")
    L.append("        const i64 r = g + (h >> 1) * 8, j = n0 + 2 * t + (h & 1);")
    L.append(f"        if (r < {ROWS} && j < {n}) out[r * {n}LL + j] = {store}({name}_epilogue(c[h], r, j{extras}));")
    L.append("      }")
    L.append("    }")
    L.append("  }")
    L.append("}")
    return "\n".join(L)


ROWS = "g_rows"
_ROWS_LINE = re.compile(rf"(  const int {ROWS} = )\d+;")


def staged_rows(rows: int, depth: int) -> int:
    """The rows a prologue's shared array holds: a whole mma tile where that fits, so that the array
    (a literal) is the same at every row count and the kernel's text differs in ROWS alone."""
    return MAX_ROWS if staged_bytes(MAX_ROWS, depth) <= SMEM_BYTES else rows


def one_tile_group(text: str) -> str | None:
    """What one-tile small GEMMs that may merge across sizes share (codegen/module.py): their text with
    the row count blanked. Everything else (tiling, K, N, the staged array, the epilogue) stays as it is,
    so kernels merge only where the rows alone differ, and the merged function takes them as its one
    argument: the one-tile form's tiling and grid do not depend on the rows (small_gemm_tiling), so the
    sizes of a range whose GEMMs are short (Wav2Vec2 under 0.35 s, a transformer under 17 tokens) run one
    function, as their other kernels do, and can be stored as formulas (bundle/families.py). The staged split
    form merges as well; None for the ring split form (its row tiles are structural)."""
    blanked, found = _ROWS_LINE.subn(r"\1#;", text)
    return blanked if found == 1 else None


def _epilogue_args(k: SmallGemmKernel) -> str:
    """The epilogue's slots after W (a residual, a bias), as the call's trailing arguments."""
    first = k.a_slots + k.w_slots
    return "".join(f", in{i}" for i in range(first, len(k.inputs)))


def _declare_weights(k: SmallGemmKernel, t: SmallGemmTiling) -> list:
    """A lane's weights in flight: 8 halves a step, or, packed, their codes' word, scale and zero point."""
    if k.packed is None:
        return [f"  uint4 wv[{t.steps}];"]
    return [f"  unsigned wq[{t.steps}], wsz[{t.steps}];   /* codes; scale | zero point << 16 */"]


def _weight_loads(k: SmallGemmKernel, p: int, indent: str) -> list:
    """Step s's weight loads for weight row `wn` at k = kk..kk+7: 8 halves, or, packed, the word of their 4-bit
    codes and their block's scale and zero point (a scale of 0 past N or K makes them zeros)."""
    n, depth = k.cols, k.depth
    ok = f"wn < {n} && kk < {depth}"
    if k.packed is None:
        return [f"{indent}wv[s] = ({ok}) ? *(const uint4*)(in{p} + wn * {depth}LL + kk) : zero;"]
    codes = k.inputs[p][0][1]   # bytes a row
    return [f"{indent}wq[s] = ({ok}) ? *(const unsigned*)(in{p} + wn * {codes}LL + kk / 2) : 0u;",
            f"{indent}wsz[s] = ({ok}) ? ({_scale_and_zero(k, p, 'kk')}) : 0u;"]


def _scale_and_zero(k: SmallGemmKernel, p: int, kk: str) -> str:
    """The C expression of weight row wn's scale for the block of k = `kk`, its bits, with the block's zero point
    code << 16 where the weight has zero points (the packed forms' wsz)."""
    block, scales = k.packed.block, k.inputs[p + 1][0][1]   # blocks a row
    scale = f"(unsigned)in{p + 1}[wn * {scales}LL + {kk} / {block}]"
    if k.packed.zero_points:
        zrow = k.inputs[p + 2][0][1]
        scale += (f" | (((unsigned)in{p + 2}[wn * {zrow}LL + {kk} / {2 * block}] >> (4 * (({kk} / {block}) & 1))) "
                  "& 15u) << 16")
    return scale


def _step_weights(k: SmallGemmKernel, indent: str) -> str:
    """Step s's 8 weights as the mma's halves: packed codes become halves only now that their loads have landed."""
    if k.packed is None:
        return f"{indent}const uint4 ws = wv[s];"
    zero = "wsz[s] >> 16" if k.packed.zero_points else f"{1 << (k.packed.bits - 1)}u"
    return f"{indent}const uint4 ws = g_unpack8_q4(wq[s], (f16)(wsz[s] & 0xFFFFu), {zero});"


def _load_weights(k: SmallGemmKernel, t: SmallGemmTiling, p: int, tile: str, indent: str) -> list:
    """Tile `tile`'s weight loads: this lane's row of W, 8 consecutive k per 32-wide step."""
    return [f"{indent}if ({tile} < {t.block_tiles}) {{",
            f"{indent}  const i64 wn = ((i64)({tile}) * {t.col_tiles} + ct) * 8 + g;",
            f"{indent}  #pragma unroll",
            f"{indent}  for (int s = 0; s < {t.steps}; ++s) {{",
            f"{indent}    const int kk = (ks * {t.steps} + s) * 32 + 8 * t;",
            *_weight_loads(k, p, indent + "    "),
            f"{indent}  }}",
            f"{indent}}}"]


def render_split_gemm(k: SmallGemmKernel, t: SmallGemmTiling, name: str) -> str:
    """The split form (see the module): a cluster of t.splits blocks per group of 8 column tiles. A's
    32-wide k steps of the block's share of K pass through a ring of SPLIT_RING shared-memory stages
    (cp.async, rows past M and k past K filled with zeros), the later steps' copies in flight while the
    tensor cores take the current one."""
    ty = ctype(k.dtype)
    mma = "f16" if k.dtype == "float16" else "bf16"
    store = "f2h" if k.dtype == "float16" else "f2b"
    m, n, depth, rt, ring = k.rows, k.cols, k.depth, t.row_tiles, SPLIT_RING
    width = t.col_tiles * 8                 # the columns of a block
    tile = rt * 16 * width                  # its partial tile, in floats
    stage = rt * 16 * 32                    # one k step of A's rows, in elements (16-byte rows of 4 chunks)
    chunks = rt * 16 * 4                    # 16-byte copies a stage takes
    smem = max(ring * stage * 2, tile * 4)  # the ring, then (reused) the partial tile
    L = _split_opening(k, t, name, smem, "[stage][row][32]: A's steps on their way to the tensor cores")
    L.append(f"  const int k0 = split * {t.steps * 32};   /* the block's share of K starts here */")
    L.append("  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);")
    L.append(f"  uint4 wv[{t.steps}];")
    L.append("  /* the weights wait for nothing: they fly while the kernel before ends */")
    L.append("  #pragma unroll")
    L.append(f"  for (int s = 0; s < {t.steps}; ++s) {{")
    L.append("    const int kk = k0 + s * 32 + 8 * t;")
    L.append(f"    wv[s] = (wn < {n} && kk < {depth}) ? *(const uint4*)(in1 + wn * {depth}LL + kk) : zero;")
    L.append("  }")
    L.append("  G_AWAIT_PREDECESSOR();   /* A comes from the kernel before */")
    L.append("  /* step s's copies: 16 bytes each, zeros past A's rows and K */")
    L.append("  const auto copy_step = [&](int s) {")
    L.append(f"    if (s < {t.steps}) {{")
    L.append(f"      for (int q = threadIdx.x; q < {chunks}; q += {t.block}) {{")
    L.append("        const int r = q >> 2, kk = k0 + s * 32 + (q & 3) * 8;")
    L.append(f"        const bool inside = r < {m} && kk < {depth};")
    L.append(f"        G_CP_ASYNC16((unsigned)__cvta_generic_to_shared(g_a + (s % {ring}) * {stage} + q * 8), "
             f"in0 + (inside ? r * {depth}LL + kk : 0LL), inside ? 16 : 0);")
    L.append("      }")
    L.append("    }")
    L.append("    G_CP_COMMIT();   /* a group per step, empty past the last, so that the wait below counts alike */")
    L.append("  };")
    L.append(f"  for (int s = 0; s < {ring - 1}; ++s) copy_step(s);")
    L.append(f"  float c[{rt}][4];")
    L.append("  #pragma unroll")
    L.append(f"  for (int mt = 0; mt < {rt}; ++mt) c[mt][0] = c[mt][1] = c[mt][2] = c[mt][3] = 0.f;")
    L.append("  #pragma unroll")
    L.append(f"  for (int s = 0; s < {t.steps}; ++s) {{")
    L.append(f"    copy_step(s + {ring - 1});")
    L.append(f"    G_CP_WAIT({ring - 1});   /* this thread's copies of step s have landed ... */")
    L.append("    __syncthreads();        /* ... and every thread's */")
    L.append(f"    const {ty}* a = g_a + (s % {ring}) * {stage};")
    L.append("    #pragma unroll")
    L.append(f"    for (int mt = 0; mt < {rt}; ++mt) {{   /* every row tile meets the same weight registers */")
    L.append("      const uint4 lo = *(const uint4*)(a + (mt * 16 + g) * 32 + 8 * t);")
    L.append("      const uint4 hi = *(const uint4*)(a + (mt * 16 + g + 8) * 32 + 8 * t);")
    L.append(f'      G_MMA("{mma}", c[mt], lo.x, hi.x, lo.y, hi.y, wv[s].x, wv[s].y);')
    L.append(f'      G_MMA("{mma}", c[mt], lo.z, hi.z, lo.w, hi.w, wv[s].z, wv[s].w);')
    L.append("    }")
    L.append("    __syncthreads();   /* the stage is read before a later step's copies land in it */")
    L.append("  }")
    L.append("  G_CP_WAIT(0);")
    L.append("  #pragma unroll")
    L.append(f"  for (int mt = 0; mt < {rt}; ++mt) {{")
    L.append(f"    *(float2*)(g_tile + (mt * 16 + g) * {width} + warp * 8 + 2 * t) = make_float2(c[mt][0], c[mt][1]);")
    L.append(f"    *(float2*)(g_tile + (mt * 16 + g + 8) * {width} + warp * 8 + 2 * t) = make_float2(c[mt][2], c[mt][3]);")
    L.append("  }")
    L += _cluster_sum(k, t, name, width, tile, store)
    L.append("}")
    return "\n".join(L)


def _split_opening(k: SmallGemmKernel, t: SmallGemmTiling, name: str, smem: int, a_layout: str) -> list:
    """The split forms' start: the epilogue function, the signature of a cluster of t.splits blocks, the shared
    buffer that holds A (a_layout) and then the partial tile, and this lane's place: its warp's column tile of
    the block's group, its weight row."""
    ty, sp = ctype(k.dtype), t.splits
    L = [ValueFunctionRenderer(k.epilogue).render_function(f"{name}_epilogue"), ""]
    params = [f"{ty}* __restrict__ out"] + [f"const {ctype(dt)}* __restrict__ in{i}" for i, (_, dt) in enumerate(k.inputs)]
    L.append(f'extern "C" __global__ void __cluster_dims__({sp}, 1, 1) __launch_bounds__({t.block}) '
             f'{name}({", ".join(params)}) {{')
    L.append(f"  __shared__ __align__(16) unsigned char g_smem[{smem}];")
    L.append(f"  {ty}* g_a = ({ty}*)g_smem;        /* {a_layout} */")
    L.append("  float* g_tile = (float*)g_smem;   /* then this block's partial products, [row][column] */")
    L.append("  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;")
    L.append(f"  const int split = blockIdx.x % {sp}, group = blockIdx.x / {sp};   /* split = the block's rank in its cluster */")
    L.append(f"  const i64 wn = ((i64)group * {t.col_tiles} + warp) * 8 + g;   /* this lane's weight row */")
    return L


def _cluster_sum(k: SmallGemmKernel, t: SmallGemmTiling, name: str, width: int, tile: int, store: str,
                 rows: str | None = None) -> list:
    """The split forms' end: after a cluster barrier every block sums one share of the tile across the
    cluster's shared memories, applies the epilogue and stores it. rows: A's rows as the text names them."""
    m, n, sp = rows or k.rows, k.cols, t.splits
    L = []
    L.append("  G_CLUSTER_SYNC();   /* every block's partial tile is written */")
    extras = _epilogue_args(k)
    L.append("  /* this block's share of the tile: the sum over the cluster, the epilogue, the store */")
    # the remote reads are plain asm, free to be scheduled together; their address comes out of a volatile
    # asm after the barrier, so no read can be moved above it
    L.append("  unsigned g_local;")
    L.append('  asm volatile("mov.u32 %0, %1;" : "=r"(g_local) : "r"((unsigned)__cvta_generic_to_shared(g_tile)));')
    # unrolled, so that every element's remote reads and epilogue loads (bias, residual) are in flight together
    L.append("  #pragma unroll")
    L.append(f"  for (int i = 0; i < {_ceil(tile, t.block * sp)}; ++i) {{")
    L.append(f"    const int e = (i * {sp} + split) * {t.block} + threadIdx.x;")
    L.append(f"    const i64 r = e / {width}, j = (i64)group * {width} + e % {width};")
    L.append(f"    if (e >= {tile} || r >= {m} || j >= {n}) continue;")
    L.append("    float acc = 0.f;")
    L.append("    #pragma unroll")
    L.append(f"    for (int q = 0; q < {sp}; ++q) acc += g_cluster_load(g_local + 4u * (unsigned)e, q);")
    L.append(f"    out[r * {n}LL + j] = {store}({name}_epilogue(acc, r, j{extras}));")
    L.append("  }")
    L.append("  G_CLUSTER_SYNC();   /* no block leaves while another reads its shared memory */")
    return L


def render_staged_split(k: SmallGemmKernel, t: SmallGemmTiling, name: str) -> str:
    """The split form at most one mma tile of rows: a cluster of t.splits blocks per group of 8 column tiles, as
    render_split_gemm, but the block stages its whole share of A's rows once (no ring, no barrier a step), and
    the lanes take k by quads. The mma only needs lanes to agree on which k they multiply: in quad q (steps
    4q..4q+3), lane t holds k = 128q + 32t .. 128q + 32t + 31 of the block's share, and step 4q + j passes its 8
    from 8j, for A and W alike. A packed weight's lane then loads its 32 codes at once (one 16-byte load, and one
    scale and zero point where a block holds them all); with 8 consecutive k a step (the one-tile form's order),
    it made 4 loads of 4 bytes and 4 of each scale and zero point for the same codes."""
    mma = "f16" if k.dtype == "float16" else "bf16"
    store = "f2h" if k.dtype == "float16" else "f2b"
    m, depth, pw = k.rows, k.depth, k.packed
    width = t.col_tiles * 8
    tile = 16 * width
    share = t.steps * 32                    # k of A a block stages
    lds = share + 16                        # its rows' stride: 32 bytes past a multiple of 128 (banks)
    # A's rows (room for a whole mma tile, so that the text is the same at every row count and kernels of a range
    # merge: one_tile_group), then (reused) the partial tile
    smem = max(MAX_ROWS * lds * 2, tile * 4)
    L = _split_opening(k, t, name, smem, f"[row][{lds}]: the block's share of A")
    L.append(f"  const int k0 = split * {share};   /* the block's share of K starts here */")
    L.append(f"  const int {ROWS} = {m};   /* A's rows: the one number that differs between sizes (one_tile_group) */")
    L.append("  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);")
    L += _staged_weight_loads(k, t) if pw is None else _packed_quad_loads(k, t)
    L.append("  G_AWAIT_PREDECESSOR();   /* A comes from the kernel before */")
    L.append("  /* the block's share of A's rows, 16 bytes a copy, zeros past K */")
    L.append(f"  for (int c = threadIdx.x; c < {ROWS} * {share // 8}; c += {t.block}) {{")
    L.append(f"    const int r = c / {share // 8}, kc = (c % {share // 8}) * 8, kk = k0 + kc;")
    L.append(f"    const bool inside = kk < {depth};")
    L.append(f"    G_CP_ASYNC16((unsigned)__cvta_generic_to_shared(g_a + r * {lds} + kc), "
             f"in0 + (inside ? r * {depth}LL + kk : 0LL), inside ? 16 : 0);")
    L.append("  }")
    L.append("  G_CP_COMMIT();")
    L.append("  G_CP_WAIT(0);")
    L.append("  __syncthreads();")
    L.append("  float c[4] = {0.f, 0.f, 0.f, 0.f};")
    L.append("  #pragma unroll")
    L.append(f"  for (int s = 0; s < {t.steps}; ++s) {{")
    L.append(f"    const int ka = {STAGED_K};   /* quad s / 4, this lane's word s % 4 */")
    L.append(_step_weights(k, "    "))
    L.append(f"    const uint4 lo = g < {ROWS} ? *(const uint4*)(g_a + g * {lds} + ka) : zero;")
    L.append(f"    const uint4 hi = g + 8 < {ROWS} ? *(const uint4*)(g_a + (g + 8) * {lds} + ka) : zero;")
    L.append(f'    G_MMA("{mma}", c, lo.x, hi.x, lo.y, hi.y, ws.x, ws.y);')
    L.append(f'    G_MMA("{mma}", c, lo.z, hi.z, lo.w, hi.w, ws.z, ws.w);')
    L.append("  }")
    L.append("  __syncthreads();   /* A is read before the partial tile takes its place */")
    L.append(f"  *(float2*)(g_tile + g * {width} + warp * 8 + 2 * t) = make_float2(c[0], c[1]);")
    L.append(f"  *(float2*)(g_tile + (g + 8) * {width} + warp * 8 + 2 * t) = make_float2(c[2], c[3]);")
    L += _cluster_sum(k, t, name, width, tile, store, ROWS)
    L.append("}")
    return "\n".join(L)


def _staged_weight_loads(k: SmallGemmKernel, t: SmallGemmTiling) -> list:
    """A lane's half weights for render_staged_split: 8 halves a step, in quads of its 32 k."""
    p, n, depth = k.a_slots, k.cols, k.depth
    return [f"  uint4 wv[{t.steps}];",
            "  /* the weights wait for nothing: they fly while the kernel before ends */",
            "  #pragma unroll",
            f"  for (int s = 0; s < {t.steps}; ++s) {{",
            f"    const int kk = k0 + {STAGED_K};",
            f"    wv[s] = (wn < {n} && kk < {depth}) ? *(const uint4*)(in{p} + wn * {depth}LL + kk) : zero;",
            "  }"]


def _packed_quad_loads(k: SmallGemmKernel, t: SmallGemmTiling) -> list:
    """A lane's packed codes for render_staged_split: its 32 codes of a quad in one 16-byte load where the codes'
    rows keep it aligned, their block's scale and zero point once where a block holds all 32."""
    p, n, depth, pw = k.a_slots, k.cols, k.depth, k.packed
    row_bytes = k.inputs[p][0][1]
    wide = row_bytes % 16 == 0
    per_quad = pw.block >= 32
    L = []
    L.append(f"  unsigned wq[{t.steps}], wsz[{t.steps}];   /* codes; scale | zero point << 16 (0: past N or K) */")
    L.append(f"  const unsigned char* codes = in{p} + wn * {row_bytes}LL;")
    L.append("  /* the weights wait for nothing: they fly while the kernel before ends */")
    L.append("  #pragma unroll")
    L.append(f"  for (int q = 0; q < {t.steps // 4}; ++q) {{")
    L.append("    const int kq = k0 + q * 128 + 32 * t;   /* this lane's 32 codes start here */")
    L.append("    uint4 w4 = zero;")
    if wide:
        L.append(f"    if (wn < {n} && kq / 2 + 16 <= {row_bytes}) w4 = *(const uint4*)(codes + kq / 2);")
        L.append(f"    else if (wn < {n}) {{")
    else:
        L.append(f"    if (wn < {n}) {{")
    L.append("      unsigned* w = (unsigned*)&w4;")
    L.append("      #pragma unroll")
    L.append(f"      for (int j = 0; j < 4; ++j) if (kq / 2 + 4 * j + 4 <= {row_bytes}) w[j] = *(const unsigned*)(codes + kq / 2 + 4 * j);")
    L.append("    }")
    L.append("    wq[4 * q] = w4.x; wq[4 * q + 1] = w4.y; wq[4 * q + 2] = w4.z; wq[4 * q + 3] = w4.w;")
    L.append("    #pragma unroll")
    L.append("    for (int j = 0; j < 4; ++j) {")
    L.append(f"      const int kx = {'kq' if per_quad else 'kq + 8 * j'};   /* the k whose block's scale these codes take */")
    if per_quad:
        L.append("      if (j > 0) { wsz[4 * q + j] = (kq + 8 * j < " + str(depth) + ") ? wsz[4 * q] : 0u; continue; }")
    L.append(f"      wsz[4 * q + j] = (wn < {n} && kq + 8 * j < {depth}) ? ({_scale_and_zero(k, p, 'kx')}) : 0u;")
    L.append("    }")
    L.append("  }")
    return L
