"""Convolution models for the channels-last conv tests, CPU (test_conv.py) and GPU (test_gpu_conv.py):
every attribute swept, with fresh random weights (never zeros)."""
import numpy as np
import onnx
from onnx import helper

from helpers import init, model, tinfo

# (id, batch, channels, spatial, out channels, kernel, strides, pads, dilations, group, bias)
CASES = [
    ("3x3", 2, 8, (9, 11), 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    ("1x1_nobias", 3, 16, (7, 7), 8, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, False),
    ("stride2_asym_pads", 2, 4, (10, 13), 6, (3, 3), (2, 2), (0, 1, 2, 1), (1, 1), 1, True),
    ("dilated", 1, 6, (12, 12), 5, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1, True),
    ("grouped", 2, 8, (6, 6), 12, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4, True),
    ("depthwise", 2, 8, (8, 8), 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 8, True),
    ("stem_7x7", 2, 3, (32, 32), 16, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1, True),
    ("rect_kernel", 1, 4, (9, 8), 4, (1, 5), (1, 2), (0, 2, 0, 2), (1, 1), 1, False),
    ("1d", 2, 8, (50,), 12, (5,), (2,), (2, 2), (1,), 1, True),
    ("1d_grouped", 1, 16, (40,), 16, (8,), (1,), (4, 3), (1,), 4, True),
]


def conv_model(case, seed=0, relu_chain=False):
    """One Conv (or Conv -> Relu -> Conv, the second 3x3 keeping the shape, with relu_chain)."""
    _, n, c, sp, m, k, s, p, d, g, bias = case
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((m, c // g, *k)) / np.sqrt(c // g * np.prod(k))).astype(np.float32)
    inits = [init("w", w)]
    ins = ["x", "w"]
    if bias:
        inits.append(init("b", rng.standard_normal(m).astype(np.float32)))
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["y0" if relu_chain else "y"], kernel_shape=list(k), strides=list(s),
                              pads=list(p), dilations=list(d), group=g)]
    if relu_chain:
        nd = len(k)
        w2 = (rng.standard_normal((m, m, *[3] * nd)) / np.sqrt(m * 3 ** nd)).astype(np.float32)
        inits.append(init("w2", w2))
        nodes += [helper.make_node("Relu", ["y0"], ["r"]),
                  helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[3] * nd, pads=[1] * 2 * nd)]
    return model(nodes, [tinfo("x", shape=[n, c, *sp])], [tinfo("y")], inits)


def ids(cases):
    return [c[0] for c in cases]


def check_conv(tmp_path, m, backend="cpu", seed=3, **kw):
    """grapec check of model m on `backend` against onnxruntime; every output must pass."""
    from grapec.tools.check import check_model
    path = str(tmp_path / "m.onnx")
    onnx.save(m, path)
    results, _ = check_model(path, backend=backend, seed=seed, **kw)
    assert all(r.ok for r in results), [(r.name, r.rel, r.max_abs, r.note) for r in results]
    return results


def residual_blocks_model(channels=128, size=56, blocks=3, seed=0):
    """A stem conv, then ResNet basic blocks: conv -> ReLU -> conv, + the block's input, ReLU. At
    128 x 56 x 56 a block's input (1.6 MB) is stored, not recomputed (passes/fuse.py RECOMPUTE_BYTES),
    so the middle block's shortcut add and ReLU fold into its second convolution (passes/epilogue.py;
    the first block's recomputes the stem's ReLU, the last one's is the pooling kernel's)."""
    rng = np.random.default_rng(seed)

    def conv(name, src, ci):
        w = (rng.standard_normal((channels, ci, 3, 3)) / np.sqrt(ci * 9)).astype(np.float32)
        inits.extend([init(f"w_{name}", w), init(f"b_{name}", rng.standard_normal(channels).astype(np.float32) * 0.1)])
        return helper.make_node("Conv", [src, f"w_{name}", f"b_{name}"], [name], pads=[1, 1, 1, 1])
    inits: list = []
    nodes = [conv("stem", "x", 3), helper.make_node("Relu", ["stem"], ["s0"])]
    for i in range(blocks):
        nodes += [conv(f"c{i}a", f"s{i}", channels), helper.make_node("Relu", [f"c{i}a"], [f"r{i}"]),
                  conv(f"c{i}b", f"r{i}", channels), helper.make_node("Add", [f"c{i}b", f"s{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"s{i + 1}"])]
    nodes.append(helper.make_node("GlobalAveragePool", [f"s{blocks}"], ["y"]))
    return model(nodes, [tinfo("x", shape=[1, 3, size, size])], [tinfo("y")], inits)
