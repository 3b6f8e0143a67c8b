"""How far cuBLASLt's heuristic is from the best cuBLASLt can do on one GEMM, fp16, one process, one GPU.

    python benchmarks/gemm_search.py [--m 128,1024,2048] [--nk 2304x768,768x768,3072x768,768x3072]

For each row-major [M,K] x [K,N] -> [M,N] (half in and out, float accumulation; the transformers'
projections at batch 1, 8 and 16 x seq 128), every time is one call in a CUDA graph of 20 calls:
  heuristic 1   cuBLASLt's first choice;
  best of 8     the fastest of the heuristic's first 8 (what grapec's load-time tuning picks);
  best of 64    the fastest of its first 64;
  split-K       the heuristic's first 8 with their K loop split 2..16 ways (where the algorithm
                can), each reduction scheme it offers: the fastest;
  torch         F.linear(x, W) with W [N, K], as torch.compile calls it.
Prints microseconds with TFLOP/s in brackets and split-K's winner (its rank in the heuristic, the
algorithm id, the split and cublasLtReductionScheme_t), so that a change to the tuning can be judged
against what cuBLASLt itself can do. The scheme: 1 in place in the output type, 2 in a float32
workspace, 4 in an output-type workspace; every split needs a reduction kernel after the GEMM unless
in place.
"""
from __future__ import annotations

import argparse
import ctypes
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

ALGO_BYTES = 64   # cublasLtMatmulAlgo_t: uint64_t data[8]
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


def cap(lt, algo, attr, dtype) -> np.ndarray:
    """A capability attribute of an initialized algorithm, as an array of dtype."""
    size = np.zeros(1, np.uint64)
    lt.matmul_algo_cap_get_attribute(algo.ctypes.data, attr, 0, 0, size.ctypes.data)
    out = np.zeros(max(int(size[0]) // np.dtype(dtype).itemsize, 1), dtype)
    lt.matmul_algo_cap_get_attribute(algo.ctypes.data, attr, out.ctypes.data, out.nbytes, size.ctypes.data)
    return out


def split_variants(blas, gemm, launch, ws_bytes: int) -> tuple:
    """(us, description) of the fastest split-K variant of the heuristic's first 8 algorithms: the
    same algorithm, tile and stages, the K loop split SPLITS ways (where its id supports split-K)."""
    from grapec.runtime.cuda.blas import COMPUTE_32F, CUDA_R, TUNE_REPEATS
    lt = blas.lt
    A = lt.MatmulAlgoConfigAttribute
    check = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
    best, what, tried = math.inf, "", 0
    for rank, ptr in enumerate(gemm.algos[:8]):
        algo_id, written = np.zeros(1, np.int32), np.zeros(1, np.uint64)
        lt.matmul_algo_config_get_attribute(ptr, A.ID, algo_id.ctypes.data, 4, written.ctypes.data)
        algo0 = np.frombuffer((ctypes.c_uint64 * (ALGO_BYTES // 8)).from_address(ptr), np.uint64).copy()
        base = np.zeros(ALGO_BYTES // 8, np.uint64)
        f16, f32 = CUDA_R["float16"], CUDA_R["float32"]
        lt.matmul_algo_init(blas.handle, COMPUTE_32F, f32, f16, f16, f16, f16, int(algo_id[0]), base.ctypes.data)
        splitk = int(cap(lt, base, lt.MatmulAlgoCapAttribute.SPLITK_SUPPORT, np.int32)[0])
        schemes = int(cap(lt, base, lt.MatmulAlgoCapAttribute.REDUCTION_SCHEME_MASK, np.uint32)[0])
        for split in SPLITS[1:] if splitk else ():
            for scheme in (s for s in (1, 2, 4) if schemes & s):
                algo = algo0.copy()
                for attr, value in ((A.SPLITK_NUM, split), (A.REDUCTION_SCHEME, scheme)):
                    v = np.array([value], np.int32 if attr == A.SPLITK_NUM else np.uint32)
                    lt.matmul_algo_config_set_attribute(algo.ctypes.data, attr, v.ctypes.data, 4)
                try:
                    lt.matmul_algo_check(blas.handle, gemm.desc, gemm.b_lay, gemm.a_lay, gemm.d_lay, gemm.d_lay,
                                         algo.ctypes.data, check.ctypes.data)
                except Exception:  # noqa: BLE001 - not for this problem
                    continue
                if int(check["workspace_size"][0]) > ws_bytes:
                    continue
                tried += 1
                us = blas._time(launch, algo.ctypes.data) * 1e3 / TUNE_REPEATS
                if us < best:
                    best, what = us, f"rank {rank} (id {int(algo_id[0])}) split {split} scheme {scheme}"
    return best, what, tried


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="128,1024,2048")
    ap.add_argument("--nk", default="2304x768,768x768,3072x768,768x3072")
    a = ap.parse_args()
    import torch
    from grapec.runtime.cuda.blas import TUNE_REPEATS, WORKSPACE_BYTES, shared_blas
    from grapec.runtime.cuda.driver import Device
    from grapec.tools.bench import torch_graph_us
    device = Device(0)
    blas = shared_blas(device)
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    print(f"{device.name}: fp16 GEMMs, us per call (graph of 20 calls); TFLOP/s in brackets\n")
    print("| M x N x K | heuristic 1 | best of 8 | best of 64 | split-K | torch F.linear | split-K's winner (variants tried) |")
    print("|---|---|---|---|---|---|---|")
    for m in (int(x) for x in a.m.split(",")):
        for n, k in (tuple(int(v) for v in nk.split("x")) for nk in a.nk.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.half)
            w = torch.randn(k, n, device="cuda", dtype=torch.half) * 0.05
            out = torch.empty(m, n, device="cuda", dtype=torch.half)
            wt = w.t().contiguous()
            gemm = blas._problem({}, [(m, k), (k, n)], "float16", (m, n), {}, False, False, WORKSPACE_BYTES, 64)

            def launch(algo, stream, gemm=gemm, x=x, w=w, out=out):
                blas.lt.matmul(blas.handle, gemm.desc, gemm.alpha.ctypes.data, w.data_ptr(), gemm.b_lay,
                               x.data_ptr(), gemm.a_lay, gemm.beta.ctypes.data, out.data_ptr(), gemm.d_lay,
                               out.data_ptr(), gemm.d_lay, algo, ws.data_ptr(), WORKSPACE_BYTES, int(stream))
            times = [blas._time(launch, al) * 1e3 / TUNE_REPEATS for al in gemm.algos]
            found, what, tried = split_variants(blas, gemm, launch, WORKSPACE_BYTES)
            ref = (x.float() @ w.float())
            torch.cuda.synchronize()
            torch_us = torch_graph_us(lambda: torch.nn.functional.linear(x, wt))
            err = (out.float() - ref).norm() / ref.norm()
            flop = 2.0 * m * n * k

            def cell(us):
                return f"{us:.1f} ({flop / us / 1e6:.0f})"
            print(f"| {m} x {n} x {k} | {cell(times[0])} | {cell(min(times[:8]))} | {cell(min(times))} | "
                  f"{cell(found)} | {cell(torch_us)} | {what} ({tried}); last out err {err:.1e} |",
                  flush=True)


if __name__ == "__main__":
    main()
