"""AttentionKernel -> one flash-attention CUDA kernel on fp16/bf16 tensor cores (mma.sync m16n8k16).

Each warp owns 16 query rows; a block of WARPS warps walks the keys in tiles of BC: the tile's k rows
and v rows go to shared memory as they are (16-byte stores; the next tile is read into registers
while this one is computed). Q Kᵀ reads its B fragments from the k rows as 32-bit loads; P V reads
them from the v rows with ldmatrix .trans, which hands each lane its two keys of one value column
(a transposing store would hit one bank eight times). The warp computes S = Q Kᵀ for its rows in registers, applies the model's own score
expression (rendered from kernel IR by the element renderer, called per score with its coordinates),
and updates the online softmax: running max m, running sum l, output O scaled by exp(m_old - m_new).
The probabilities go from the S accumulators straight into the A fragments of P·V: the m16n8 f32
accumulator layout of two neighbouring n-tiles is the m16k16 A layout. Scores and probabilities never
touch memory; out = O / l is written through the output's strides.

Fragment layouts (PTX ISA, mma.m16n8k16): g = lane / 4, t = lane % 4.
    A (16x16): a0a1 (g, 2t..2t+1)  a2a3 (g+8, 2t..)  a4a5 (g, 2t+8..)  a6a7 (g+8, 2t+8..)
    B (16x8):  b0b1 (k = 2t..2t+1, n = g)  b2b3 (k = 2t+8.., n = g)
    C (16x8):  c0c1 (g, 2t..2t+1)  c2c3 (g+8, 2t..2t+1)
"""
from __future__ import annotations

import math

from ..ir.attention import AttentionKernel
from .cuda import ValueFunctionRenderer, ctype
from .launch import Launch

SMS = 132            # H100/H200 SMs: the warp count per block shrinks until the grid fills them
MAX_WARPS = 4
MAX_KEY_TILE = 64
MAX_PREFETCH = 8
MAX_KEY_SLICES = 4
MAX_CLUSTER = 8      # blocks of a thread-block cluster that split one query tile's keys (portable size)
MIN_KEYS_PER_WARP = 16
MAX_STATIC_SMEM = 46 * 1024   # of the 48 KB a block may declare statically; the rest is the merge's
MIN_BLOCKS = 0       # __launch_bounds__' second argument (0: none): blocks an SM should hold at once

ATTENTION_PRELUDE = r"""
__device__ __forceinline__ unsigned g_pack2(unsigned short lo, unsigned short hi) { return (unsigned)lo | ((unsigned)hi << 16); }
/* two 8x8 b16 matrices, transposed: lanes 0-15 give the row addresses (shared space) */
#define G_LDMATRIX_X2_T(b0, b1, addr) \
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(addr))
#define G_MMA(TY, c, a0, a1, a2, a3, b0, b1) \
  asm("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
      : "+f"((c)[0]), "+f"((c)[1]), "+f"((c)[2]), "+f"((c)[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
/* thread-block clusters (sm_90): a barrier of the cluster's blocks, whose writes to shared memory it
   makes visible to all of them, and a float read from block `rank`'s shared memory (at the address
   `local` has in this block's) */
#define G_CLUSTER_SYNC() asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory")
/* asynchronous 16-byte copies global -> shared (sm_80+); `bytes` 0 fills the 16 bytes with zeros */
#define G_CP_ASYNC16(dst, src, bytes) \
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes) : "memory")
#define G_CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define G_CP_WAIT(n) asm volatile("cp.async.wait_group %0;" :: "n"(n) : "memory")
/* not volatile: read after the barrier, the values do not change, and the reads of a sum must be in
   flight together (one at a time, 8 ranks x 4 elements a thread took microseconds) */
__device__ __forceinline__ float g_cluster_load(unsigned local, int rank) {
  unsigned remote; float v;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote));
  return v;
}
"""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def attention_launch(k: AttentionKernel) -> Launch:
    """Launch.split is the number of key slices: warps that share one query tile, each walking its
    own slice of every key tile, their partial softmaxes merged at the end. A query tile's keys may also
    be split over the blocks of a cluster (cluster_ranks): the grid then holds that many blocks a tile."""
    warps, slices, _, ranks = tiling_of(k)
    return Launch("attention", math.prod(k.batch) * _ceil(k.seq_q, 16 * warps) * ranks, 32 * warps * slices,
                  split=slices)


def tiling_of(k: AttentionKernel) -> tuple:
    """attention_tiling, with the cluster's blocks a query tile (1) where a recorded tiling has three numbers."""
    t = attention_tiling(k)
    return tuple(t) + (1,) * (4 - len(t))


def attention_tiling(k: AttentionKernel) -> tuple:
    """(warps per query tile, key slices, keys per warp per step, blocks of a cluster per query tile): the
    kernel's own where it records them, else by its sizes: as many warps as still fill the GPU's SMs, then
    key slices, then, where the blocks still fill few SMs (a decode step's grouped query heads: one block
    per KV head), the keys split over a cluster's blocks too."""
    if k.tiling:
        return k.tiling
    z = math.prod(k.batch)
    warps = MAX_WARPS
    while warps > 1 and z * _ceil(k.seq_q, 16 * warps) < SMS:
        warps //= 2
    slices = key_slices(k) if warps == 1 else 1
    ranks = cluster_ranks(k, z, slices) if warps == 1 and k.seq_q <= 16 else 1
    return warps, slices, _key_tile(k, 32 * warps * slices, slices, ranks), ranks


def cluster_ranks(k: AttentionKernel, blocks: int, slices: int) -> int:
    """Blocks of a cluster that split a head's one query tile's keys (a decode step's few query rows):
    while the blocks fill at most half the SMs, up to MAX_CLUSTER, each walking one key tile of
    MIN_KEYS_PER_WARP keys a warp or more, as long as a block's shared arrays fit. A decode step at past
    384 (8 KV heads, their 4 query heads as rows, 4 key slices) ran 8 blocks on 132 SMs, 3 dependent key
    tiles each, 5.6 us on an H200."""
    if slices < 2 or 2 * blocks > SMS:
        return 1
    ranks = max(1, min(MAX_CLUSTER, SMS // blocks, _ceil(k.seq_k, MIN_KEYS_PER_WARP * slices)))
    while ranks > 1 and not _cluster_fits(k, slices, ranks):
        ranks -= 1
    return ranks


def _cluster_fits(k: AttentionKernel, slices: int, ranks: int) -> bool:
    """A cluster block's static shared arrays: the key and value tiles, the key slices' partial outputs
    (an array of their own: the tiles are small) and the block's partial output for the cluster's merge."""
    dp, dvp = _ceil(k.head_dim, 16) * 16, _ceil(k.value_dim, 16) * 16
    keys = slices * _key_tile(k, 32 * slices, slices, ranks)
    tiles = keys * (dp + 8 + dvp + 8) * 2   # the kernel is fp16/bf16 only
    partials = ((slices - 1) + 1) * (dvp // 8) * 4 * 32 * 4 + (2 * slices + 2) * 16 * 4
    return tiles + partials <= MAX_STATIC_SMEM


def attention_structure(k: AttentionKernel, launch: Launch) -> tuple:
    """What the kernel's literal-only numbers derive from: shared-array and fragment sizes, warps and
    key tiles (codegen/module.py merges attention kernels of one structure, their other numbers as
    arguments)."""
    return (k.dtype, launch.block, launch.split, key_tile(k), tiling_of(k)[3], k.head_dim, k.value_dim)


def key_slices(k: AttentionKernel) -> int:
    """With one warp per block and still too few blocks to fill the GPU (BERT at seq 128: 12 heads x
    8 query tiles), a warp would walk all the keys alone, one dependent tile after another. Up to
    MAX_KEY_SLICES warps split them instead, a slice per 32 keys, as long as the merge's
    partial outputs fit where the key tile was."""
    slices = min(MAX_KEY_SLICES, _ceil(k.seq_k, 32))
    while slices > 1 and not _merge_fits(k, slices):
        slices -= 1
    return slices


def _merge_fits(k: AttentionKernel, slices: int) -> bool:
    dp, dvp = _ceil(k.head_dim, 16) * 16, _ceil(k.value_dim, 16) * 16
    keys = slices * _key_tile(k, 32 * slices, slices)
    isz = 2   # the kernel is fp16/bf16 only
    k_bytes, v_bytes = keys * (dp + 8) * isz, keys * (dvp + 8) * isz
    partial_bytes = (slices - 1) * 16 * dvp * 4
    return partial_bytes <= k_bytes and k_bytes + v_bytes <= MAX_STATIC_SMEM


def key_tile(k: AttentionKernel) -> int:
    """Keys per warp per step of the kernel's main loop (a step's tile holds a key slice's worth
    for each of its warps: attention_tiling)."""
    return attention_tiling(k)[2]


def _key_tile(k: AttentionKernel, block: int, slices: int, ranks: int = 1) -> int:
    """The next tile waits in registers: at most MAX_PREFETCH 16-byte vectors a thread per operand.
    slices: the block's warps that split the keys; ranks: the cluster's blocks that split them too."""
    dp, dvp = _ceil(k.head_dim, 16) * 16, _ceil(k.value_dim, 16) * 16
    fits = MAX_PREFETCH * block * 8 // max(dp, dvp) // slices // 16 * 16
    return max(16, min(MAX_KEY_TILE, _ceil(_ceil(k.seq_k, slices * ranks), 16) * 16, fits))


def key_end(k: AttentionKernel, slices: int, rows: int, qtiles: int) -> str:
    """The keys a block walks, as a C expression: all of them, or with a causal score
    (causal_offset) those up to its last query row's last visible key: the tiles past it hold only
    hidden keys, whose exp is 0. Uniform over the block (its warps meet at barriers every tile)."""
    if k.causal_offset is None:
        return str(k.seq_k)
    last = "q0 + 15" if slices > 1 else f"(i64)(blockIdx.x % {qtiles}) * {rows} + {rows - 1}"
    return f"min((i64){k.seq_k}, {last} + {k.causal_offset + 1})"


def render_attention(k: AttentionKernel, launch: Launch, name: str) -> str:
    """-> CUDA C for the kernel (its score function first), named `name`."""
    ty = ctype(k.dtype)
    mma = "f16" if k.dtype == "float16" else "bf16"
    from_f = "f2h" if k.dtype == "float16" else "f2b"
    slices = max(1, launch.split)
    warps = launch.block // 32 // slices   # query tiles of 16 rows per block
    ranks = tiling_of(k)[3]   # blocks of a cluster that split one query tile's keys
    rows = 16 * warps
    qtiles = _ceil(k.seq_q, rows)
    s, t, d, dv = k.seq_q, k.seq_k, k.head_dim, k.value_dim
    dp, dvp = _ceil(d, 16) * 16, _ceil(dv, 16) * 16
    bw = key_tile(k)   # keys of one warp per step
    bc = bw * slices           # keys of the block per step
    kw = "ks * {} + ".format(bw) if slices > 1 else ""   # this warp's first key in the tile
    nb = len(k.batch)
    extras = len(k.inputs) - 3
    score_fn = f"{name}_score"
    L = []
    params = [f"{ty}* __restrict__ out"] + [f"const {ctype(dt)}* __restrict__ in{i}" for i, (_, dt) in enumerate(k.inputs)]
    bounds = f"{launch.block}, {MIN_BLOCKS}" if MIN_BLOCKS else f"{launch.block}"
    cluster = f"__cluster_dims__({ranks}, 1, 1) " if ranks > 1 else ""
    L.append(f'extern "C" __global__ void {cluster}__launch_bounds__({bounds}) {name}({", ".join(params)}) {{')
    L.append(f"  __shared__ __align__(16) {ty} g_k[{bc}][{dp + 8}];    /* key rows x head dims */")
    L.append(f"  __shared__ __align__(16) {ty} g_v[{bc}][{dvp + 8}];   /* key rows x value dims */")
    L.append("  G_AWAIT_PREDECESSOR();")
    # the score function as a lambda in the kernel: its numbers (a mask's row stride) are the kernel's
    L += ["  " + line for line in ValueFunctionRenderer(k.score).render_function(score_fn, as_lambda=True).split("\n")]
    L.append("  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t2 = (lane & 3) * 2;")
    if ranks > 1:   # the cluster's blocks share one query tile; block `crank` walks its span of the keys
        L.append("  const int ks = warp;")
        L.append(f"  const i64 tile = blockIdx.x / {ranks};")
        L.append(f"  const int crank = (int)(blockIdx.x % {ranks});")
        L.append(f"  const i64 z = tile / {qtiles}, q0 = (i64)(tile % {qtiles}) * 16;")
    elif slices > 1:   # the block's warps share 16 query rows; warp ks walks key slice ks of each tile
        L.append("  const int ks = warp;")
        L.append(f"  const i64 z = blockIdx.x / {qtiles}, q0 = (i64)(blockIdx.x % {qtiles}) * 16;")
    else:
        L.append(f"  const i64 z = blockIdx.x / {qtiles}, q0 = (i64)(blockIdx.x % {qtiles}) * {rows} + warp * 16;")
    rest = "z"
    for a in range(nb - 1, -1, -1):
        L.append(f"  const i64 i{a} = {rest} % {k.batch[a]};" if a else f"  const i64 i{a} = {rest};")
        if a:
            L.append(f"  const i64 z{a} = {rest} / {k.batch[a]};")
            rest = f"z{a}"
    for tag, op in (("q", k.q), ("k", k.k), ("v", k.v), ("o", k.out)):
        base = " + ".join([str(op.offset)] + [f"i{a} * {op.strides[a]}LL" for a in range(nb) if op.strides[a]])
        L.append(f"  const i64 {tag}z = {base};")
    qr, qc = k.q.strides[-2:]
    kr, kc = k.k.strides[-2:]
    vr, vc = k.v.strides[-2:]
    orow, ocol = k.out.strides[-2:]
    # q fragments, once: rows q0+g and q0+g+8, head dims 16kk + 2t (+1, +8, +9)
    L.append(f"  unsigned qa[{dp // 16}][4];")
    L.append("  #pragma unroll")
    L.append(f"  for (int kk = 0; kk < {dp // 16}; ++kk) {{")
    L.append("    #pragma unroll")
    L.append("    for (int h = 0; h < 4; ++h) {")
    L.append("      const i64 r = q0 + g + (h & 1) * 8, c = kk * 16 + t2 + (h >> 1) * 8;")
    L.append(f"      const {ty} x0 = (r < {s} && c < {d}) ? in0[qz + r * {qr}LL + c * {qc}LL] : ({ty})0;")
    L.append(f"      const {ty} x1 = (r < {s} && c + 1 < {d}) ? in0[qz + r * {qr}LL + (c + 1) * {qc}LL] : ({ty})0;")
    L.append("      qa[kk][h] = g_pack2(x0, x1);")
    L.append("    }")
    L.append("  }")
    L.append(f"  float o[{dvp // 8}][4];")
    L.append("  #pragma unroll")
    L.append(f"  for (int n = 0; n < {dvp // 8}; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;")
    L.append("  float m[2] = {-G_INF, -G_INF}, l[2] = {0.f, 0.f};")
    copies = [_TileCopy("k", k.k, d, dp, 1, "g_k", k, bc, launch.block, ty),
              _TileCopy("v", k.v, dv, dvp, 2, "g_v", k, bc, launch.block, ty)]
    if ranks > 1:   # each block's span: whole key tiles, the last ones past the keys empty
        L.append(f"  const i64 kall = {key_end(k, slices, rows, qtiles)};")
        L.append(f"  const i64 span = (kall + {ranks * bc - 1}) / {ranks * bc} * {bc};")
        L.append("  const i64 kbeg = crank * span, kend = min(kall, kbeg + span);")
    else:
        L.append("  const i64 kbeg = 0;")
        L.append(f"  const i64 kend = {key_end(k, slices, rows, qtiles)};")
    for cp in copies:
        L += cp.declare() + cp.fetch("kbeg", "  ")
    L.append(f"  for (i64 k0 = kbeg; k0 < kend; k0 += {bc}) {{")
    L.append("    __syncthreads();   /* the previous tile's readers are done */")
    for cp in copies:
        L += cp.stash("    ")
    L.append("    __syncthreads();")
    L.append(f"    if (k0 + {bc} < kend) {{   /* the next tile's loads fly while this one is computed */")
    for cp in copies:
        L += cp.fetch(f"(k0 + {bc})", "      ")
    L.append("    }")
    L.append(f"    float sc[{bw // 8}][4];")
    L.append("    #pragma unroll")
    L.append(f"    for (int n = 0; n < {bw // 8}; ++n) {{")
    L.append("      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;")
    L.append("      #pragma unroll")
    L.append(f"      for (int kk = 0; kk < {dp // 16}; ++kk) {{")
    L.append(f"        const unsigned b0 = *(const unsigned*)&g_k[{kw}n * 8 + g][kk * 16 + t2];")
    L.append(f"        const unsigned b1 = *(const unsigned*)&g_k[{kw}n * 8 + g][kk * 16 + 8 + t2];")
    L.append(f'        G_MMA("{mma}", sc[n], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b0, b1);')
    L.append("      }")
    L.append("    }")
    coords = ", ".join([f"i{a}" for a in range(nb)] + ["r", "j"])
    extra_args = "".join(f", in{3 + e}" for e in range(extras))
    L.append("    float mx[2] = {-G_INF, -G_INF};")
    L.append("    #pragma unroll")
    L.append(f"    for (int n = 0; n < {bw // 8}; ++n) {{")
    L.append("      #pragma unroll")
    L.append("      for (int h = 0; h < 4; ++h) {")
    L.append(f"        const i64 r = q0 + g + (h >> 1) * 8, j = k0 + {kw}n * 8 + t2 + (h & 1);")
    L.append(f"        const float x = j >= {t} ? -G_INF : r >= {s} ? 0.f : {score_fn}(sc[n][h], {coords}{extra_args});")
    L.append("        sc[n][h] = x;")
    L.append("        mx[h >> 1] = fmaxf(mx[h >> 1], x);")
    L.append("      }")
    L.append("    }")
    L.append("    float base[2], alpha[2];")
    L.append("    #pragma unroll")
    L.append("    for (int h = 0; h < 2; ++h) {   /* the four lanes of a quad share a row */")
    L.append("      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));")
    L.append("      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));")
    L.append("      const float mn = fmaxf(m[h], mx[h]);")
    L.append("      base[h] = mn == -G_INF ? 0.f : mn;   /* a row masked so far: exp(-inf) = 0, not NaN */")
    L.append("      alpha[h] = exp2f((m[h] - base[h]) * 1.4426950408889634f);")
    L.append("      m[h] = mn;")
    L.append("      l[h] *= alpha[h];")
    L.append("    }")
    L.append("    #pragma unroll")
    L.append(f"    for (int n = 0; n < {dvp // 8}; ++n) {{ o[n][0] *= alpha[0]; o[n][1] *= alpha[0]; o[n][2] *= alpha[1]; o[n][3] *= alpha[1]; }}")
    L.append(f"    unsigned pa[{bw // 16}][4];")
    L.append("    #pragma unroll")
    L.append(f"    for (int n = 0; n < {bw // 8}; ++n) {{")
    L.append("      #pragma unroll")
    L.append("      for (int h = 0; h < 4; ++h) {")
    L.append("        sc[n][h] = exp2f((sc[n][h] - base[h >> 1]) * 1.4426950408889634f);")
    L.append("        l[h >> 1] += sc[n][h];")
    L.append("      }")
    L.append(f"      pa[n >> 1][(n & 1) * 2] = g_pack2({from_f}(sc[n][0]), {from_f}(sc[n][1]));")
    L.append(f"      pa[n >> 1][(n & 1) * 2 + 1] = g_pack2({from_f}(sc[n][2]), {from_f}(sc[n][3]));")
    L.append("    }")
    L.append("    #pragma unroll")
    L.append(f"    for (int kk = 0; kk < {bw // 16}; ++kk) {{")
    L.append(f"      const unsigned vrow = (unsigned)__cvta_generic_to_shared(&g_v[{kw}kk * 16 + (lane & 15)][0]);")
    L.append("      #pragma unroll")
    L.append(f"      for (int n = 0; n < {dvp // 8}; ++n) {{")
    L.append("        unsigned b0, b1;")
    L.append("        G_LDMATRIX_X2_T(b0, b1, vrow + n * 16);")
    L.append(f'        G_MMA("{mma}", o[n], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b0, b1);')
    L.append("      }")
    L.append("    }")
    L.append("  }")
    L.append("  #pragma unroll")
    L.append("  for (int h = 0; h < 2; ++h) {   /* each lane summed its own columns: add the quad's */")
    L.append("    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);")
    L.append("    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);")
    L.append("  }")
    if slices > 1:
        L += _merge_slices(slices, dvp, ranks)
    if ranks > 1:
        L += _merge_cluster(ranks, dvp)
    L.append("  #pragma unroll")
    L.append(f"  for (int n = 0; n < {dvp // 8}; ++n) {{")
    L.append("    #pragma unroll")
    L.append("    for (int h = 0; h < 4; ++h) {")
    L.append("      const i64 r = q0 + g + (h >> 1) * 8, c = n * 8 + t2 + (h & 1);")
    L.append(f"      if (r < {s} && c < {dv}) out[oz + r * {orow}LL + c * {ocol}LL] = {from_f}(o[n][h] / l[h >> 1]);")
    L.append("    }")
    L.append("  }")
    if ranks > 1:
        L.append("  }")
        L.append("  G_CLUSTER_SYNC();   /* no block leaves while block 0 reads its shared memory */")
    L.append("}")
    return "\n".join(L)


def _merge_slices(slices: int, dvp: int, ranks: int = 1) -> list:
    """Warp 0 merges the key slices' partial softmaxes (running max m, sum l, output o):
    out = sum_w o_w exp(m_w - M) / sum_w l_w exp(m_w - M), M the largest m_w. The other warps hand
    theirs over in shared memory (their o where the key tile was, or, in a cluster, whose key tiles are
    small, in an array of their own) and are done; in a cluster they stay for its barriers."""
    nv = dvp // 8
    lines = [
        "  __syncthreads();   /* every warp is done with the key tiles: g_k takes the partial outputs */",
        f"  __shared__ float g_pm[{slices}][16], g_pl[{slices}][16];",
        f"  __shared__ float g_po[{(slices - 1) * nv * 4 * 32}];" if ranks > 1 else "  float* g_po = (float*)&g_k[0][0];",
        "  if ((lane & 3) == 0) { g_pm[ks][g] = m[0]; g_pm[ks][g + 8] = m[1]; g_pl[ks][g] = l[0]; g_pl[ks][g + 8] = l[1]; }",
        "  if (ks > 0) {",
        "    #pragma unroll",
        f"    for (int n = 0; n < {nv}; ++n)",
        "      #pragma unroll",
        f"      for (int h = 0; h < 4; ++h) g_po[(((ks - 1) * {nv} + n) * 4 + h) * 32 + lane] = o[n][h];",
        "  }",
        "  __syncthreads();",
        "  if (ks > 0) return;" if ranks == 1 else "  if (ks == 0) {",
        "  #pragma unroll",
        "  for (int hr = 0; hr < 2; ++hr) {",
        "    const int row = g + hr * 8;",
        "    float mm = m[hr];",
        f"    for (int w = 1; w < {slices}; ++w) mm = fmaxf(mm, g_pm[w][row]);",
        "    const float b = mm == -G_INF ? 0.f : mm;   /* a row masked everywhere stays 0 / 0, as unsplit */",
        "    const float s0 = exp2f((m[hr] - b) * 1.4426950408889634f);",
        "    m[hr] = mm;   /* l and o are now relative to the block's max: a cluster's merge reads m */",
        "    l[hr] *= s0;",
        "    #pragma unroll",
        f"    for (int n = 0; n < {nv}; ++n) {{ o[n][2 * hr] *= s0; o[n][2 * hr + 1] *= s0; }}",
        f"    for (int w = 1; w < {slices}; ++w) {{",
        "      const float sw = exp2f((g_pm[w][row] - b) * 1.4426950408889634f);",
        "      l[hr] += g_pl[w][row] * sw;",
        "      #pragma unroll",
        f"      for (int n = 0; n < {nv}; ++n)",
        "        #pragma unroll",
        "        for (int e = 0; e < 2; ++e)",
        f"          o[n][2 * hr + e] += g_po[(((w - 1) * {nv} + n) * 4 + 2 * hr + e) * 32 + lane] * sw;",
        "    }",
        "  }",
    ]
    return lines + (["  }"] if ranks > 1 else [])


def _merge_cluster(ranks: int, dvp: int) -> list:
    """Block 0 of the cluster merges its blocks' partial softmaxes as _merge_slices merges warps': each
    block's warp 0 leaves (m, l, o) in its shared memory, block 0's warp 0 reads them through distributed
    shared memory. Every thread meets both cluster barriers; only block 0's warp 0 goes on to the store
    (the caller closes its `if`)."""
    nv = dvp // 8
    return [
        f"  __shared__ float g_cm[16], g_cl[16], g_co[{nv * 4 * 32}];",
        "  if (ks == 0) {",
        "    if ((lane & 3) == 0) { g_cm[g] = m[0]; g_cm[g + 8] = m[1]; g_cl[g] = l[0]; g_cl[g + 8] = l[1]; }",
        "    #pragma unroll",
        f"    for (int n = 0; n < {nv}; ++n)",
        "      #pragma unroll",
        f"      for (int h = 0; h < 4; ++h) g_co[(n * 4 + h) * 32 + lane] = o[n][h];",
        "  }",
        "  G_CLUSTER_SYNC();   /* every block's partial softmax is written */",
        "  if (ks == 0 && crank == 0) {",
        "  unsigned g_lm, g_ll, g_lo;   /* addresses taken after the barrier: no remote read moves above it */",
        '  asm volatile("mov.u32 %0, %1;" : "=r"(g_lm) : "r"((unsigned)__cvta_generic_to_shared(g_cm)));',
        '  asm volatile("mov.u32 %0, %1;" : "=r"(g_ll) : "r"((unsigned)__cvta_generic_to_shared(g_cl)));',
        '  asm volatile("mov.u32 %0, %1;" : "=r"(g_lo) : "r"((unsigned)__cvta_generic_to_shared(g_co)));',
        "  #pragma unroll",
        "  for (int hr = 0; hr < 2; ++hr) {",
        "    const int row = g + hr * 8;",
        "    float mm = m[hr];",
        f"    for (int b = 1; b < {ranks}; ++b) mm = fmaxf(mm, g_cluster_load(g_lm + 4u * row, b));",
        "    const float base = mm == -G_INF ? 0.f : mm;   /* a row masked everywhere stays 0 / 0, as unsplit */",
        "    const float s0 = exp2f((m[hr] - base) * 1.4426950408889634f);",
        "    l[hr] *= s0;",
        "    #pragma unroll",
        f"    for (int n = 0; n < {nv}; ++n) {{ o[n][2 * hr] *= s0; o[n][2 * hr + 1] *= s0; }}",
        f"    for (int b = 1; b < {ranks}; ++b) {{",
        "      const float sb = exp2f((g_cluster_load(g_lm + 4u * row, b) - base) * 1.4426950408889634f);",
        "      l[hr] += g_cluster_load(g_ll + 4u * row, b) * sb;",
        "      #pragma unroll",
        f"      for (int n = 0; n < {nv}; ++n)",
        "        #pragma unroll",
        "        for (int e = 0; e < 2; ++e)",
        "          o[n][2 * hr + e] += g_cluster_load(g_lo + 4u * (unsigned)((n * 4 + 2 * hr + e) * 32 + lane), b) * sb;",
        "    }",
        "  }",
    ]


class _TileCopy:
    """Moving one operand's key tile from global memory to shared memory in two halves, so that the
    next tile's loads are in flight while the warp computes on this one (a software pipeline):
    fetch(k0) reads into registers, stash() writes them to shared memory. 16-byte reads where the
    rows are contiguous and aligned, element reads otherwise; zeros past the last key."""

    def __init__(self, tag, op, width, padded, slot, smem, k: AttentionKernel, bc: int, block: int, ty: str):
        row, col = op.strides[-2:]
        self.vec = col == 1 and width % 8 == 0 and all(x % 8 == 0 for x in (op.offset, row, *op.strides[:-2]))
        self.step = 8 if self.vec else 1
        self.per_row = padded // self.step
        self.total = bc * self.per_row
        self.n = _ceil(self.total, block)
        self.tag, self.op, self.width, self.slot, self.smem = tag, op, width, slot, smem
        self.seq_k, self.block, self.ty = k.seq_k, block, ty
        self.reg = f"g_{tag}buf"

    def declare(self) -> list:
        return [f"  {'uint4' if self.vec else self.ty} {self.reg}[{self.n}];"]

    def _loop(self, indent: str) -> list:
        guard = f"if (e < {self.total}) " if self.total % self.block else ""
        return [f"{indent}#pragma unroll", f"{indent}for (int it = 0; it < {self.n}; ++it) {{",
                f"{indent}  const int e = threadIdx.x + it * {self.block}, j = e / {self.per_row}, c = (e % {self.per_row}) * {self.step};",
                f"{indent}  {guard}{{"]

    def fetch(self, k0: str, indent: str) -> list:
        row, col = self.op.strides[-2:]
        ok = f"{k0} + j < {self.seq_k} && c < {self.width}"
        src = f"in{self.slot} + {self.tag}z + ({k0} + j) * {row}LL + c"
        if self.vec:
            body = [f"{indent}    {self.reg}[it].x = {self.reg}[it].y = {self.reg}[it].z = {self.reg}[it].w = 0u;",
                    f"{indent}    if ({ok}) {self.reg}[it] = *(const uint4*)({src});"]
        else:
            body = [f"{indent}    {self.reg}[it] = ({ok}) ? in{self.slot}[{self.tag}z + ({k0} + j) * {row}LL + c * {col}LL] : ({self.ty})0;"]
        return self._loop(indent) + body + [f"{indent}  }}", f"{indent}}}"]

    def stash(self, indent: str) -> list:
        if self.vec:   # rows are padded+8 elements: every 8-element chunk is 16-byte aligned
            body = [f"{indent}    *(uint4*)&{self.smem}[j][c] = {self.reg}[it];"]
        else:
            body = [f"{indent}    {self.smem}[j][c] = {self.reg}[it];"]
        return self._loop(indent) + body + [f"{indent}  }}", f"{indent}}}"]
