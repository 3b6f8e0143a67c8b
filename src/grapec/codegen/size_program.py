"""A size record computed on the GPU from the range's formulas (issue 33: Grape's metadata, compressed).

A shared exec's sized kernels read their numbers from a record in device memory
(runtime/cuda/size_record.py). Today a record is a row of a table with a row per size, copied into
place by the exec's loader node. For a range of 158401 sizes (Wav2Vec2's samples 1600..160000) a
row per size does not fit the memory a range may take, nor does joining each size's plan at load.
The numbers are formulas of the sizes (bundle/formulas.py NumberFit: integer polynomials in the dims
and in round-ups and floors of them), so a small program of those formulas, evaluated by the loader
from the size's dims, gives the record instead.

The program is an int64 array:
    [0] dims  [1] variables beyond the dims (Rounded)  [2] outputs
    then the offset of each variable's record, then the offset of each output's record, then the program's
    length (where the last record ends: the loader copies a block's records whole);
    a variable's record: to, divide (0 or 1), polynomial   (ceil(P / to), or that times to)
    an output's record:  is_f64 (0 or 1), polynomial       (an f64 output is stored as its double's bits)
    a polynomial: terms, then per term: coefficient, factors, then (variable, exponent) per factor
Variables are numbered dims first, then the Rounded ones in order; each Rounded reads only earlier ones.

SIZE_PROGRAM is the evaluator as C: the device compiles it into the loader kernel (EVAL_SIZES), and a
test compiles the same text with the host's C compiler and checks it against NumberFit.numbers.
run_size_program is the same evaluation in Python.
"""
from __future__ import annotations

import numpy as np

MAX_VARIABLES = 64       # dims plus Rounded variables a program may have (the evaluator's array)
MAX_DIMS = 3             # the loader kernel takes the dims as arguments: 3-D ranges at most


def size_program(fit, ndims: int, slots: list, f64: list | None = None) -> np.ndarray:
    """The program whose outputs are the fit's `slots` (in that order) at sizes of `ndims` dims; f64[i]:
    output i is a float argument (stored as its double's bits). fit: a bundle/formulas.py NumberFit, its
    `extra` and `slots` read (not imported: codegen sits below bundle). A monomial lists the exponents of
    the variables that existed when it was fitted: fewer than all of them, maybe."""
    if not 1 <= ndims <= MAX_DIMS or ndims + len(fit.extra) > MAX_VARIABLES:
        raise ValueError(f"a size program takes 1..{MAX_DIMS} dims and {MAX_VARIABLES} variables in all")
    f64 = f64 or [False] * len(slots)
    records = []
    for r in fit.extra:
        records.append([int(r.to), int(bool(r.divide))] + _polynomial(r.monos, r.coefs))
    for j, is_f64 in zip(slots, f64):
        if not 0 <= j < len(fit.slots) or fit.slots[j] is None:
            raise ValueError(f"slot {j} has no formula")
        monos, coefs = fit.slots[j]
        records.append([int(bool(is_f64))] + _polynomial(monos, coefs))
    head = 3 + len(records) + 1
    offsets, at = [], head
    for rec in records:
        offsets.append(at)
        at += len(rec)
    offsets.append(at)
    return np.array([ndims, len(fit.extra), len(slots)] + offsets + [x for rec in records for x in rec], np.int64)


def _polynomial(monos: list, coefs) -> list:
    out = [len(monos)]
    for e, c in zip(monos, coefs):
        factors = [(v, p) for v, p in enumerate(e) if p]
        out += [int(c), len(factors)] + [x for f in factors for x in f]
    return out


def run_size_program(prog: np.ndarray, dims) -> np.ndarray:
    """The program's outputs at these dims (int64; an f64 output as its double's bits)."""
    p = [int(x) for x in prog]
    ndims, nextra, nout = p[0], p[1], p[2]
    cols = [int(d) for d in dims][:ndims]
    for i in range(nextra):
        at = p[3 + i]
        to, divide = p[at], p[at + 1]
        q = -(-_poly(p, at + 2, cols) // to)
        cols.append(q if divide else q * to)
    out = np.empty(nout, np.int64)
    for j in range(nout):
        at = p[3 + nextra + j]
        v = _poly(p, at + 1, cols)
        out[j] = np.float64(v).view(np.int64) if p[at] else v
    return out


def _poly(p: list, at: int, cols: list) -> int:
    total = 0
    terms, at = p[at], at + 1
    for _ in range(terms):
        v, factors, at = p[at], p[at + 1], at + 2
        for _ in range(factors):
            v *= cols[p[at]] ** p[at + 1]
            at += 2
        total += v
    return total


# The evaluator: G_HD is __device__ for the GPU, empty for a host compiler (the test's)
SIZE_PROGRAM = r"""
#ifndef G_HD
#define G_HD __device__
#endif
#define G_MAX_VARIABLES %(max_variables)d
G_HD static long long g_size_poly(const long long* p, long long at, const long long* cols) {
  long long total = 0;
  const long long terms = p[at++];
  for (long long t = 0; t < terms; ++t) {
    long long v = p[at];
    const long long factors = p[at + 1];
    at += 2;
    for (long long f = 0; f < factors; ++f, at += 2)
      for (long long e = 0; e < p[at + 1]; ++e) v *= cols[p[at]];
    total += v;
  }
  return total;
}
/* cols[0..dims) hold the dims: the Rounded variables after them, in order */
G_HD static void g_size_variables(const long long* p, long long* cols) {
  for (long long i = 0; i < p[1]; ++i) {
    const long long at = p[3 + i], to = p[at];
    const long long v = g_size_poly(p, at + 2, cols);
    const long long q = v >= 0 ? (v + to - 1) / to : -((-v) / to);   /* ceil(v / to), v of either sign */
    cols[p[0] + i] = p[at + 1] ? q : q * to;
  }
}
G_HD static long long g_size_output(const long long* p, long long j, const long long* cols) {
  const long long at = p[3 + p[1] + j];
  const long long v = g_size_poly(p, at + 1, cols);
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
# program is a chain of dependent loads (a term's factor count, then its factors, then their variables): read
# from global memory by one thread it took 60 us a launch (session 55, full Wav2Vec2: 11 variables of up to 39
# terms, 118 outputs of up to 39). So each block copies the variables' records and its outputs' records into
# shared memory first, all its threads at once, then thread 0 works out the variables and each thread an
# output. A block whose records do not fit evaluates from global memory: slower, never wrong.
EVAL_OUTPUTS_PER_BLOCK = 64   # a loader block's outputs: its grid is the outputs over this (eval_sizes_grid)
EVAL_SHARED = 4096            # int64s of records a block holds in shared memory (32 KiB)
EVAL_SIZES_BLOCK = 128
EVAL_SIZES = SIZE_PROGRAM + r"""
#define G_EVAL_OUTPUTS %(outputs)d
#define G_EVAL_SHARED %(shared)d
extern "C" __global__ void grapec_eval_sizes(const long long* __restrict__ prog, long long* __restrict__ record,
                                             const long long* __restrict__ dims) {
  __shared__ long long cols[G_MAX_VARIABLES];
  __shared__ long long held[G_EVAL_SHARED];
  const long long nd = prog[0], nx = prog[1], no = prog[2];
  const long long j0 = (long long)blockIdx.x * G_EVAL_OUTPUTS;
  const long long j1 = min(no, j0 + G_EVAL_OUTPUTS);
  if (j0 >= no && blockIdx.x > 0) return;
  /* the variables' records [v0, v1) and this block's outputs' [o0, o1); the offsets' fence ends the last */
  const long long v0 = 3 + nx + no + 1, v1 = prog[3 + nx];
  const long long o0 = prog[3 + nx + j0], o1 = prog[3 + nx + j1];
  const bool fits = (v1 - v0) + (o1 - o0) <= G_EVAL_SHARED;
  if (fits) {
    for (long long i = threadIdx.x; i < v1 - v0; i += blockDim.x) held[i] = prog[v0 + i];
    for (long long i = threadIdx.x; i < o1 - o0; i += blockDim.x) held[v1 - v0 + i] = prog[o0 + i];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 0; i < 3; ++i) cols[i] = dims[i];
    for (long long i = 0; i < nx; ++i) {
      const long long at = prog[3 + i];
      const long long* p = fits ? held : prog;
      const long long a = fits ? at - v0 : at;
      const long long to = p[a];
      const long long v = g_size_poly(p, a + 2, cols);
      const long long q = v >= 0 ? (v + to - 1) / to : -((-v) / to);   /* ceil(v / to), as g_size_variables */
      cols[nd + i] = p[a + 1] ? q : q * to;
    }
  }
  __syncthreads();
  for (long long j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    const long long at = prog[3 + nx + j];
    const long long* p = fits ? held : prog;
    const long long a = fits ? at - o0 + (v1 - v0) : at;
    const long long v = g_size_poly(p, a + 1, cols);
    record[j] = p[a] ? __double_as_longlong((double)v) : v;
  }
}
""" % {"outputs": EVAL_OUTPUTS_PER_BLOCK, "shared": EVAL_SHARED}


def eval_sizes_grid(prog: np.ndarray) -> int:
    """The loader's blocks for this program: one per EVAL_OUTPUTS_PER_BLOCK outputs, at least one."""
    return max(1, -(-int(prog[2]) // EVAL_OUTPUTS_PER_BLOCK))
