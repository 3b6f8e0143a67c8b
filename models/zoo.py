"""grapec model zoo:

The zoo is cut by family: zoo_core.py (configs, specs, random inputs, ZooModel), zoo_export.py
(torch -> ONNX), zoo_transformers.py, zoo_cnns.py, zoo_control_flow.py; this module is the registry.
"""
from __future__ import annotations

import os
import sys
from typing import Callable

import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # the family modules beside this one

from zoo_cnns import googlenet, inception_v3, resnet50  # noqa: E402
from zoo_control_flow import control_flow  # noqa: E402
from zoo_core import CONFIGS, OPSET, SEED, SIZES, Spec, ZooModel, random_inputs, spec  # noqa: E402
from zoo_transformers import bert, gpt2, gpt2_generate, wav2vec2  # noqa: E402

__all__ = ["CONFIGS", "MODELS", "OPSET", "SEED", "SIZES", "Spec", "TORCH_MODELS", "ZooModel", "get", "op_types",
           "random_inputs", "spec"]

# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

MODELS: dict[str, Callable[..., ZooModel]] = {
    "gpt2": gpt2,
    "bert": bert,
    "wav2vec2": wav2vec2,
    "resnet50": resnet50,
    "googlenet": googlenet,
    "inception_v3": inception_v3,
    "gpt2_generate": gpt2_generate,
    "control_flow": control_flow,
}
TORCH_MODELS = ("gpt2", "bert", "wav2vec2", "resnet50", "googlenet", "inception_v3", "gpt2_generate")


def get(name: str, size: str = "tiny", seed: int = SEED) -> ZooModel:
    """Build a zoo model (imports torch/transformers for all but control_flow)."""
    spec(name, size)  # validates name and size
    return MODELS[name](size=size, seed=seed)


def op_types(model: onnx.ModelProto) -> dict[str, int]:
    """Op types used by a model (including inside subgraphs), with counts; keys are 'domain::Op' off the default domain."""
    counts: dict[str, int] = {}

    def walk(g):
        for n in g.node:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
            counts[key] = counts.get(key, 0) + 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)

    walk(model.graph)
    return dict(sorted(counts.items()))
