"""ResNet-50's convolutions, one by one: grapec's im2col + cuBLASLt path against cuDNN (through
nvidia-cudnn-frontend, conv + bias + ReLU fused) in NCHW and NHWC, and PyTorch's own convolution
in both memory formats, in one process on one GPU.

    python benchmarks/conv_layouts.py [--batch 1,8,32] [--dtype fp16] [--out DIR]

Each variant is captured as a CUDA graph of 20 calls and replayed (grapec.tools.bench.torch_graph_us); the table gives the median
microseconds per call, weighted by how often ResNet-50 runs the shape, and the ratios to PyTorch's
channels-last convolution (above 1: faster than it). Every cuDNN output is checked against
PyTorch's (||out-ref||/||ref||). It answers: which layout the cuDNN path must run in, and at which
batch it beats grapec's gather + GEMM.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

# (in channels, out channels, kernel, stride, input size, times ResNet-50 runs it)
RESNET50 = [
    (3, 64, 7, 2, 224, 1),
    (64, 64, 1, 1, 56, 1), (64, 64, 3, 1, 56, 3), (64, 256, 1, 1, 56, 4), (256, 64, 1, 1, 56, 2),
    (256, 128, 1, 1, 56, 1), (128, 128, 3, 2, 56, 1), (128, 512, 1, 1, 28, 4), (512, 128, 1, 1, 28, 3),
    (128, 128, 3, 1, 28, 3), (256, 512, 1, 2, 56, 1),
    (512, 256, 1, 1, 28, 1), (256, 256, 3, 2, 28, 1), (256, 1024, 1, 1, 14, 6), (1024, 256, 1, 1, 14, 5),
    (256, 256, 3, 1, 14, 5), (512, 1024, 1, 2, 28, 1),
    (1024, 512, 1, 1, 14, 1), (512, 512, 3, 2, 14, 1), (512, 2048, 1, 1, 7, 3), (2048, 512, 1, 1, 7, 2),
    (512, 512, 3, 1, 7, 2), (1024, 2048, 1, 2, 14, 1),
]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))


def cudnn_conv(torch, cudnn, handle, x, w, b, stride, pad, nhwc: bool):
    """A built cuDNN graph for relu(conv(x, w) + b), and the call that runs it on torch's stream."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    dt = cudnn.data_type.HALF if x.dtype == torch.float16 else cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)

    def strides(dims):
        nn_, cc, hh, ww = dims
        return [cc * hh * ww, 1, ww * cc, cc] if nhwc else [cc * hh * ww, hh * ww, ww, 1]
    X = g.tensor(name="X", dim=[n, c, h, wd], stride=strides([n, c, h, wd]), data_type=dt)
    W = g.tensor(name="W", dim=[k, c, r, s], stride=strides([k, c, r, s]), data_type=dt)
    B = g.tensor(name="B", dim=[1, k, 1, 1], stride=[k, 1, k, k], data_type=dt)
    conv = g.conv_fprop(image=X, weight=W, padding=[pad, pad], stride=[stride, stride], dilation=[1, 1])
    Y = g.relu(input=g.add(a=conv, b=B))
    oh = (h + 2 * pad - r) // stride + 1
    # the output's strides said outright: left to cuDNN they follow the input's (NHWC) whatever y is
    Y.set_output(True).set_data_type(dt).set_dim([n, k, oh, oh]).set_stride(strides([n, k, oh, oh]))
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    fmt = torch.channels_last if nhwc else torch.contiguous_format
    xx, ww = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
    y = torch.empty((n, k, oh, oh), dtype=x.dtype, device="cuda").contiguous(memory_format=fmt)
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device="cuda")
    pack = {X: xx, W: ww, B: b.view(1, k, 1, 1), Y: y}

    def run():
        cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
        g.execute(pack, ws, handle=handle)
    return run, y


def im2col_gemm(torch, x, w, b, stride, pad):
    """grapec's batch > 1 path today: the gather into [C*K*K, N*OHW], one GEMM, a reorder to NCHW
    fused with bias + ReLU (three passes, as the plan runs them)."""
    n, c, h, _ = x.shape
    k, _, r, _ = w.shape
    w2 = w.reshape(k, -1)

    def run():
        col = torch.nn.functional.unfold(x, r, padding=pad, stride=stride)      # [N, CKK, OHW]
        col = col.permute(1, 0, 2).reshape(c * r * r, -1)
        y = w2 @ col
        oh = (h + 2 * pad - r) // stride + 1
        return torch.relu(y.view(k, n, oh, oh).permute(1, 0, 2, 3) + b.view(1, k, 1, 1))
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import torch
    import cudnn
    from grapec.tools.bench import torch_graph_us
    torch.backends.cudnn.benchmark = True
    dtype = torch.float16 if a.dtype == "fp16" else torch.float32
    handle = cudnn.create_handle()
    rows, totals = [], {}
    for batch in [int(v) for v in a.batch.split(",")]:
        tot = {}
        for (ci, co, k, s, hw, times) in RESNET50:
            pad = k // 2
            x = torch.randn(batch, ci, hw, hw, device="cuda", dtype=dtype)
            w = torch.randn(co, ci, k, k, device="cuda", dtype=dtype) / (ci * k * k) ** 0.5
            b = torch.randn(co, device="cuda", dtype=dtype)
            ref = torch.relu(torch.nn.functional.conv2d(x.float(), w.float(), b.float(), s, pad))
            row = {"batch": batch, "shape": f"{ci}->{co} {k}x{k}/{s} @{hw}", "times": times}
            xl, wl = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
            row["torch_nhwc"] = torch_graph_us(lambda: torch.relu_(torch.nn.functional.conv2d(xl, wl, b, s, pad)))
            row["torch_nchw"] = torch_graph_us(lambda: torch.relu_(torch.nn.functional.conv2d(x, w, b, s, pad)))
            row["im2col_gemm"] = torch_graph_us(im2col_gemm(torch, x, w, b, s, pad))
            for nhwc in (False, True):
                key = "cudnn_nhwc" if nhwc else "cudnn_nchw"
                try:
                    run, y = cudnn_conv(torch, cudnn, handle, x, w, b, s, pad, nhwc)
                    run()
                    torch.cuda.synchronize()
                    row[key + "_err"] = float((y.float() - ref).norm() / ref.norm())
                    row[key] = torch_graph_us(run)
                except Exception as e:  # noqa: BLE001 - a probe: record why a variant did not run
                    row[key] = None
                    row[key + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            for key in ("torch_nhwc", "torch_nchw", "im2col_gemm", "cudnn_nchw", "cudnn_nhwc"):
                if row.get(key) is not None:
                    tot[key] = tot.get(key, 0.0) + row[key] * times
            print(json.dumps(row), flush=True)
        totals[batch] = tot
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "conv_layouts.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "totals": totals}, f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}, {a.dtype}: ResNet-50's convolutions (+bias+ReLU), us summed over the net; "
          "ratio = torch channels-last / variant")
    print("| batch | torch NHWC | torch NCHW | im2col+GEMM | cuDNN NCHW | cuDNN NHWC |")
    print("|---|---|---|---|---|---|")
    for batch, tot in totals.items():
        ref = tot.get("torch_nhwc")
        cells = [f"{tot[k]:.0f} ({ref / tot[k]:.2f}x)" if k in tot else "-" for k in
                 ("torch_nhwc", "torch_nchw", "im2col_gemm", "cudnn_nchw", "cudnn_nhwc")]
        print(f"| {batch} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
