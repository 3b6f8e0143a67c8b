"""The cost-based choices a size of a range repeats from a larger size of its launch structure
(compiler/structures.py hands over the `chosen` dict that fusion, aligned_rows and mappings fill in).

Choices are keyed by node and value names, which restart at every compile; a size compiled like another may
have another launch structure, where a name belongs to another op. So each choice is recorded with the ONNX
nodes it was made for, and carries over only where they match (GPT-2 seq 1..512: seq 1's LM-head gemv took the
name of seq 512's logits cast and its thread per element, 50 blocks for 50257 columns, 422 us where its own warps
take 19).
"""
from __future__ import annotations


def made_of(origin) -> tuple:
    """A fused kernel's ONNX nodes as a set: fusion may merge the same ones in another order at another size."""
    return tuple(sorted(set(origin)))


def record(chosen: dict | None, key, value, origin: tuple):
    """The choice `value` under key, made for a node from these ONNX nodes."""
    if chosen is not None:
        chosen[key] = value
        chosen[("origin", key)] = origin


def pinned(chosen: dict | None, key, origin: tuple):
    """The choice recorded under key where it was made for the same ONNX nodes, else None."""
    if chosen is None or chosen.get(("origin", key)) != origin:
        return None
    return chosen.get(key)
