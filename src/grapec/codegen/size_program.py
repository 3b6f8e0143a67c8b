"""A size record computed on the GPU from the range's formulas (issue 33: Grape's metadata, compressed).

A shared exec's sized kernels read their numbers from a record in device memory
(runtime/cuda/size_record.py). Today a record is a row of a table with a row per size, copied into
place by the exec's loader node. For a range of 158401 sizes (Wav2Vec2's samples 1600..160000) a
row per size does not fit the memory a range may take, nor does joining each size's plan at load.
The numbers are formulas of the sizes (bundle/formulas.py NumberFit: integer polynomials in the dims
and in round-ups and floors of them), so a small program of those formulas, evaluated by the loader
from the size's dims, gives the record instead.

The program is an int64 array:
    [0] dims  [1] variables beyond the dims (Rounded)  [2] outputs  [3] a term's width, in int64s
    then the offset of each variable's record, then the offset of each output's record, then the program's
    length (where the last record ends: the loader copies a block's records whole);
    a variable's record: to, divide (0 or 1), polynomial   (ceil(P / to), or that times to)
    an output's record:  is_f64 (0 or 1), polynomial       (an f64 output is stored as its double's bits)
    a polynomial: terms, then each term: coefficient, then its factors packed four to an int64, 16 bits each
    (variable | exponent << 8; a zero field ends them)
Variables are numbered dims first, then the Rounded ones in order; each Rounded reads only earlier ones.
Terms have one width so that the loader's threads each find their own term without walking the others.

SIZE_PROGRAM is the evaluator as C: the device compiles it into the loader kernel (EVAL_SIZES), and a
test compiles the same text with the host's C compiler and checks it against NumberFit.numbers.
run_size_program is the same evaluation in Python.
"""
from __future__ import annotations

import numpy as np

MAX_VARIABLES = 64       # dims plus Rounded variables a program may have (the evaluator's array)
MAX_DIMS = 3             # the loader kernel takes the dims as arguments: 3-D ranges at most
FACTORS_PER_WORD = 4     # a term's factors, 16 bits each, packed into int64s


def size_program(fit, ndims: int, slots: list, f64: list | None = None) -> np.ndarray:
    """The program whose outputs are the fit's `slots` (in that order) at sizes of `ndims` dims; f64[i]:
    output i is a float argument (stored as its double's bits). fit: a bundle/formulas.py NumberFit, its
    `extra` and `slots` read (not imported: codegen sits below bundle). A monomial lists the exponents of
    the variables that existed when it was fitted: fewer than all of them, maybe."""
    if not 1 <= ndims <= MAX_DIMS or ndims + len(fit.extra) > MAX_VARIABLES:
        raise ValueError(f"a size program takes 1..{MAX_DIMS} dims and {MAX_VARIABLES} variables in all")
    f64 = f64 or [False] * len(slots)
    polys = [(r.monos, r.coefs) for r in fit.extra]
    for j in slots:
        if not 0 <= j < len(fit.slots) or fit.slots[j] is None:
            raise ValueError(f"slot {j} has no formula")
        polys.append(fit.slots[j])
    width = 1 + max([1] + [-(-sum(1 for p in e if p) // FACTORS_PER_WORD) for monos, _ in polys for e in monos])
    records = []
    for r in fit.extra:
        records.append([int(r.to), int(bool(r.divide))] + _polynomial(r.monos, r.coefs, width))
    for j, is_f64 in zip(slots, f64):
        monos, coefs = fit.slots[j]
        records.append([int(bool(is_f64))] + _polynomial(monos, coefs, width))
    head = 4 + len(records) + 1
    offsets, at = [], head
    for rec in records:
        offsets.append(at)
        at += len(rec)
    offsets.append(at)
    return np.array([ndims, len(fit.extra), len(slots), width] + offsets + [x for rec in records for x in rec],
                    np.int64)


def _polynomial(monos: list, coefs, width: int) -> list:
    out = [len(monos)]
    for e, c in zip(monos, coefs):
        words = [0] * (width - 1)
        for k, (v, p) in enumerate((v, p) for v, p in enumerate(e) if p):
            if not 0 < p < 128:   # the top field of a word stays clear of the sign bit
                raise ValueError(f"exponent {p} of a size formula is out of a size program's range (1..127)")
            words[k // FACTORS_PER_WORD] |= (v | int(p) << 8) << (16 * (k % FACTORS_PER_WORD))
        out += [int(c)] + words
    return out


def run_size_program(prog: np.ndarray, dims) -> np.ndarray:
    """The program's outputs at these dims (int64; an f64 output as its double's bits)."""
    p = [int(x) for x in prog]
    ndims, nextra, nout, width = p[0], p[1], p[2], p[3]
    cols = [int(d) for d in dims][:ndims]
    for i in range(nextra):
        at = p[4 + i]
        to, divide = p[at], p[at + 1]
        q = -(-_poly(p, at + 2, cols, width) // to)
        cols.append(q if divide else q * to)
    out = np.empty(nout, np.int64)
    for j in range(nout):
        at = p[4 + nextra + j]
        v = _poly(p, at + 1, cols, width)
        out[j] = np.float64(v).view(np.int64) if p[at] else v
    return out


def _poly(p: list, at: int, cols: list, width: int) -> int:
    total = 0
    for t in range(p[at]):
        term = p[at + 1 + t * width: at + 1 + (t + 1) * width]
        v = term[0]
        for word in term[1:]:
            while word:
                v *= cols[word & 0xff] ** ((word >> 8) & 0xff)
                word >>= 16
        total += v
    return total


# The evaluator: G_HD is __device__ for the GPU, empty for a host compiler (the test's)
SIZE_PROGRAM = r"""
#ifndef G_HD
#define G_HD __device__
#endif
#define G_MAX_VARIABLES %(max_variables)d
/* the sum of a polynomial's terms first, first + step, ...: a thread's share of it (w: a term's width) */
G_HD static long long g_size_terms(const long long* p, long long at, const long long* cols, long long w,
                                   long long first, long long step) {
  long long total = 0;
  const long long terms = p[at];
  for (long long t = first; t < terms; t += step) {
    const long long* term = p + at + 1 + t * w;
    long long v = term[0];
    for (long long k = 1; k < w; ++k)
      for (unsigned long long f = (unsigned long long)term[k]; f; f >>= 16)
        for (unsigned long long e = (f >> 8) & 0xff; e; --e) v *= cols[f & 0xff];
    total += v;
  }
  return total;
}
G_HD static long long g_size_ceil(long long v, long long to) {   /* ceil(v / to), v of either sign */
  return v >= 0 ? (v + to - 1) / to : -((-v) / to);
}
/* cols[0..dims) hold the dims: the Rounded variables after them, in order */
G_HD static void g_size_variables(const long long* p, long long* cols) {
  for (long long i = 0; i < p[1]; ++i) {
    const long long at = p[4 + i];
    const long long q = g_size_ceil(g_size_terms(p, at + 2, cols, p[3], 0, 1), p[at]);
    cols[p[0] + i] = p[at + 1] ? q : q * p[at];
  }
}
G_HD static long long g_size_output(const long long* p, long long j, const long long* cols) {
  const long long at = p[4 + p[1] + j];
  const long long v = g_size_terms(p, at + 1, cols, p[3], 0, 1);
  if (!p[at]) return v;
#ifdef __CUDA_ARCH__
  return __double_as_longlong((double)v);
#else
  const double d = (double)v;
  long long bits;
  memcpy(&bits, &d, sizeof bits);
  return bits;
#endif
}
""" % {"max_variables": MAX_VARIABLES}

# The loader node of a family's exec (runtime/cuda/family_exec.py), first in every launch, so on the critical
# path: the dims are written with the inputs, so that a switch between sizes sets no node. Evaluating a
# program is a chain of dependent loads and multiplies: read from global memory by one thread it took 60 us a
# launch (session 55, full Wav2Vec2: 11 variables of up to 39 terms, 118 outputs of up to 39), and 35 us from
# shared memory (session 56). So each block copies the variables' records and its outputs' records into
# shared memory, all its threads at once; then its first warp works out the variables, its lanes sharing each
# one's terms (a warp sum), and each warp takes an output, its lanes sharing the terms. A block whose records
# do not fit evaluates from global memory: slower, never wrong. Every lane of a warp runs each loop the same
# number of times, so each shuffle is reached by all 32.
EVAL_OUTPUTS_PER_BLOCK = 32   # a loader block's outputs: its grid is the outputs over this (eval_sizes_grid)
EVAL_SHARED = 4096            # int64s of records a block holds in shared memory (32 KiB)
EVAL_SIZES_BLOCK = 256
EVAL_SIZES = SIZE_PROGRAM + r"""
#define G_EVAL_OUTPUTS %(outputs)d
#define G_EVAL_SHARED %(shared)d
#define G_EVAL_BLOCK %(block)d
#define G_EVAL_WARPS (G_EVAL_BLOCK / 32)
__device__ static long long g_warp_sum(long long v) {
  for (int k = 16; k; k >>= 1) v += __shfl_xor_sync(0xffffffffu, v, k);
  return v;
}
extern "C" __global__ void __launch_bounds__(G_EVAL_BLOCK)
grapec_eval_sizes(const long long* __restrict__ prog, long long* __restrict__ record,
                  const long long* __restrict__ dims) {
  __shared__ long long cols[G_MAX_VARIABLES];
  __shared__ long long variable_at[G_MAX_VARIABLES];
  __shared__ long long held[G_EVAL_SHARED];
  const long long nd = prog[0], nx = prog[1], no = prog[2], w = prog[3];
  const long long j0 = (long long)blockIdx.x * G_EVAL_OUTPUTS;
  const long long j1 = min(no, j0 + G_EVAL_OUTPUTS);
  if (j0 >= no && blockIdx.x > 0) return;
  /* the variables' records [v0, v1) and this block's outputs' [o0, o1); the offsets' fence ends the last */
  const long long v0 = 4 + nx + no + 1, v1 = prog[4 + nx];
  const long long o0 = prog[4 + nx + j0], o1 = prog[4 + nx + j1];
  const bool fits = (v1 - v0) + (o1 - o0) <= G_EVAL_SHARED;
  const long long* p = fits ? held : prog;
  if (fits) {
    for (long long i = threadIdx.x; i < v1 - v0; i += G_EVAL_BLOCK) held[i] = prog[v0 + i];
    for (long long i = threadIdx.x; i < o1 - o0; i += G_EVAL_BLOCK) held[v1 - v0 + i] = prog[o0 + i];
  }
  if (threadIdx.x < nx) variable_at[threadIdx.x] = prog[4 + threadIdx.x] - (fits ? v0 : 0);
  if (threadIdx.x < 3) cols[threadIdx.x] = dims[threadIdx.x];
  __syncthreads();
  const unsigned lane = threadIdx.x %% 32, warp = threadIdx.x / 32;
  if (warp == 0) {   /* the variables, one after another: each is a sum of a few terms, a lane's share each */
    for (long long i = 0; i < nx; ++i) {
      const long long a = variable_at[i];
      const long long q = g_size_ceil(g_warp_sum(g_size_terms(p, a + 2, cols, w, lane, 32)), p[a]);
      if (lane == 0) cols[nd + i] = p[a + 1] ? q : q * p[a];
      __syncwarp();
    }
  }
  __syncthreads();
  for (long long base = j0; base < j1; base += G_EVAL_WARPS) {
    const long long j = base + warp;
    const long long a = j < j1 ? prog[4 + nx + j] - (fits ? o0 - (v1 - v0) : 0) : -1;
    const long long s = g_warp_sum(a < 0 ? 0 : g_size_terms(p, a + 1, cols, w, lane, 32));
    if (a >= 0 && lane == 0) record[j] = p[a] ? __double_as_longlong((double)s) : s;
  }
}
""" % {"outputs": EVAL_OUTPUTS_PER_BLOCK, "shared": EVAL_SHARED, "block": EVAL_SIZES_BLOCK}


def eval_sizes_grid(prog: np.ndarray) -> int:
    """The loader's blocks for this program: one per EVAL_OUTPUTS_PER_BLOCK outputs, at least one."""
    return max(1, -(-int(prog[2]) // EVAL_OUTPUTS_PER_BLOCK))
