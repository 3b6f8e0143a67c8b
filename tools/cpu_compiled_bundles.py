"""Compile on a machine without a GPU, run on one: a ConvTranspose decoder and a bidirectional LSTM.

    python tools/cpu_compiled_bundles.py make DIR     # here (no GPU): bundles with sm_90 code + onnxruntime refs
    python tools/cpu_compiled_bundles.py run DIR      # on the GPU machine (carry DIR): cuda backend vs the refs
"""
import glob
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]

import grapec  # noqa: E402


def decoder_model(rng):
    from onnx import helper
    from helpers import init, model, tinfo

    def w(*s):
        return (rng.standard_normal(s) * 0.2).astype(np.float32)
    return model([helper.make_node("Conv", ["x", "w0", "b0"], ["a"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", ["a"], ["a1"]),
                  helper.make_node("ConvTranspose", ["a1", "w1", "b1"], ["u1"], strides=[2, 2], pads=[1, 1, 1, 1],
                                   output_padding=[1, 1], group=2),
                  helper.make_node("Relu", ["u1"], ["u1r"]),
                  helper.make_node("ConvTranspose", ["u1r", "w2", "b2"], ["u2"], strides=[2, 2], kernel_shape=[2, 2]),
                  helper.make_node("Sigmoid", ["u2"], ["y"])],
                 [tinfo("x", shape=[2, 16, 24, 24])], [tinfo("y")],
                 [init("w0", w(32, 16, 3, 3)), init("b0", w(32)), init("w1", w(32, 8, 4, 4)), init("b1", w(16)),
                  init("w2", w(16, 4, 2, 2)), init("b2", w(4))])


def make(out):
    from helpers import ort_run
    from test_recurrent import recurrent_model
    rng = np.random.default_rng(5)
    cases = [("convtranspose_decoder", decoder_model(rng), {"x": rng.standard_normal((2, 16, 24, 24)).astype(np.float32)}),
             ("lstm_bidir", *recurrent_model("LSTM", direction="bidirectional"))]
    os.makedirs(out, exist_ok=True)
    for name, m, feeds in cases:
        b = grapec.compile(m, shapes={k: v.shape for k, v in feeds.items()}, targets=["sm_90"], strict=True)
        b.write(os.path.join(out, f"{name}.grape"))
        np.savez(os.path.join(out, f"{name}.npz"), **{"in_" + k: v for k, v in feeds.items()},
                 **{"ref_" + k: v for k, v in ort_run(m, feeds).items()})
        print(name, b.manifest["targets"], b.manifest["buckets"][0]["steps"])


def run(folder):
    ok = True
    for p in sorted(glob.glob(os.path.join(folder, "*.grape"))):
        d = np.load(p[:-6] + ".npz")
        out = grapec.load(p, backend="cuda").run({k[3:]: d[k] for k in d if k.startswith("in_")})
        for k in (k for k in d if k.startswith("ref_")):
            g, r = out[k[4:]], d[k]
            good = np.allclose(g, r, 1e-4, 1e-4)
            ok &= good
            print(f"{os.path.basename(p)}: {k[4:]} {list(g.shape)} max-abs {np.abs(g - r).max():.3g} "
                  f"rel {np.linalg.norm(g - r) / np.linalg.norm(r):.3g} {'ok' if good else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "run"):
        sys.exit(__doc__)
    sys.exit(make(sys.argv[2]) or 0 if sys.argv[1] == "make" else run(sys.argv[2]))
