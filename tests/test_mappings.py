"""passes/mappings.py: a size of a range repeats its launch structure's thread mappings (compiler/structures.py
hands it the larger size's choices by node name), but only for the kernel they were chosen for."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from grapec.cost.device import load_profile
from grapec.compiler.pipeline import compile_graph
from grapec.frontend.onnx_import import import_model
from grapec.ir.graph import Graph
from grapec.ir.kernel import is_kernel_node
from grapec.passes.choices import made_of

VOCAB, WIDTH = 50257, 256   # an LM head at one token: a gemv whose rows are the vocabulary's columns


def _lm_head() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((WIDTH, VOCAB)) * 0.02).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"])], "head",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", WIDTH])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "seq", VOCAB])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _head_kernel(chosen: dict):
    """The gemv's kernel node at seq 1, compiled with `chosen` handed in (and filled)."""
    Graph.restart_names()
    g = compile_graph(import_model(_lm_head()), {"x": (1, 1, WIDTH)}, notes=[], profile=load_profile(None),
                      chosen=chosen)
    nodes = [n for n in g.nodes if is_kernel_node(n) and "MatMul_0" in n.origin]
    assert len(nodes) == 1, [(n.name, n.origin) for n in g.nodes]
    return nodes[0]


def test_a_mapping_carries_over_only_to_a_node_made_from_the_same_onnx_nodes():
    own = {}
    node = _head_kernel(own)
    mapping = node.attrs["kernel"].mapping
    assert mapping[0] != "element", mapping   # a thread per column of 256 products: the cost model's last pick
    # the same name recorded for another op at a larger size (seq 512's logits cast, a thread per element)
    other = {"mappings": {node.name: ("element", 256, 4), ("origin", node.name): ("Cast_7",)}}
    assert _head_kernel(other).attrs["kernel"].mapping == mapping
    assert other["mappings"][("origin", node.name)] == made_of(node.origin)   # and recorded anew for the next size
    # recorded for this very op (its ONNX nodes merged in any order), the structure's choice is repeated even where
    # the cost model prices another
    same = {"mappings": {node.name: ("element", 256, 4), ("origin", node.name): made_of(reversed(node.origin))}}
    assert _head_kernel(same).attrs["kernel"].mapping[0] == "element"
