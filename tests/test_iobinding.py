"""IOBinding (runtime/binding.py) and the analysis behind zero-copy I/O (runtime/zero_copy.py): which
graph steps read a model input's bytes or write an output's, through every alias, and why an I/O must
be copied instead. The CUDA patching itself is in test_gpu_iobinding.py."""
import os

import numpy as np
import pytest
from onnx import helper

import grapec
from grapec.compiler import compile_model
from grapec.errors import InputError
from grapec.runtime.binding import _from_dlpack, device_buffer
from grapec.runtime.zero_copy import io_routes, step_buffers
from helpers import model, tinfo
from test_control_flow import if_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")


@pytest.fixture(scope="module")
def gpt2():
    return compile_model(GPT2, dims={"batch": 1}, dynamic={"seq": (3, 6)}, targets=[])


def _overlaps(buf, other):
    return buf.space == other.space and buf.offset < other.offset + other.nbytes and other.offset < buf.offset + buf.nbytes


def test_an_input_is_read_by_exactly_the_steps_that_touch_its_bytes(gpt2):
    """A graph input owns its bytes for the whole run, so the steps reading it are those naming any
    buffer overlapping them: the routes, found through the plan's aliases, must be exactly those."""
    for plan in gpt2.plans:
        routes = io_routes(plan)
        for name, b in plan.inputs:
            buf = plan.buffers[b]
            touching = sorted({i for i, st in enumerate(plan.steps) for x in sum(step_buffers(st), [])
                               if x >= 0 and _overlaps(plan.buffers[x], buf)})
            assert routes[name].reason == "" and routes[name].steps == touching and touching
        out = routes["logits"]
        assert out.reason == "" and out.nbytes == plan.buffers[dict(plan.outputs)["logits"]].nbytes
        writers = [i for i in out.steps if plan.storage_of()[plan.steps[i].out] == out.buffer]
        assert len(writers) == 1


def test_ios_that_must_be_copied_say_why():
    m = model([helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["z"])],
              [tinfo("x", shape=[4])], [tinfo("y"), tinfo("z")])
    plan = compile_model(m, shapes={"x": [4]}, targets=[]).plans[0]
    routes = io_routes(plan)
    assert "input 'x' itself" in routes["y"].reason and routes["z"].reason == ""
    plan = compile_model(if_model(), shapes={"x": [5], "c": []}, targets=[]).plans[0]
    routes = io_routes(plan)
    assert "If/Loop" in routes["x"].reason and routes["x"].steps == []
    plan.aliases = None
    assert "recompile" in io_routes(plan)["x"].reason


def test_aliases_round_trip_through_the_bundle(gpt2):
    from grapec.bundle.format import Bundle
    again = Bundle.from_bytes(gpt2.to_bytes())
    for a, b in zip(gpt2.plans, again.plans):
        assert b.aliases == a.aliases and a.aliases
        root = b.storage_of()
        for x, of in b.aliases:   # an alias has its owner's bytes
            assert (b.buffers[x].space, b.buffers[x].offset) == (b.buffers[root[of]].space, b.buffers[root[of]].offset)


def test_cpu_backend_writes_bound_outputs_and_checks_bindings(gpt2):
    sess = grapec.load(gpt2, backend="cpu")
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 256, (1, 5)).astype(np.int64)
    binding = sess.io_binding()
    binding.bind_input("input_ids", ids)
    out = np.full((1, 5, 256), np.nan, np.float32)
    binding.bind_output("logits", out)
    sess.run_with_iobinding(binding)
    want = sess.run({"input_ids": ids})["logits"]
    assert binding.get_outputs()["logits"] is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], want)
    binding.bind_output("logits")   # no array: the session's own
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.get_outputs()["logits"], want)
    with pytest.raises(InputError, match="unknown input 'ids'"):
        binding.bind_input("ids", ids)
    with pytest.raises(InputError, match="unknown output 'probs'"):
        binding.bind_output("probs", out)
    binding.bind_output("logits", np.empty((1, 4, 256), np.float32))
    with pytest.raises(InputError, match=r"shape \[1, 4, 256\].*\[1, 5, 256\]"):
        sess.run_with_iobinding(binding)
    binding.bind_output("logits", np.empty((1, 5, 256), np.float64))
    with pytest.raises(InputError, match="expected dtype float32, got float64"):
        sess.run_with_iobinding(binding)

    class OnGpu:   # a device array: the CPU backend refuses it by name
        __cuda_array_interface__ = {"shape": (1, 5, 256), "typestr": "<f4", "data": (1 << 20, False), "version": 3}
    binding.bind_output("logits", OnGpu())
    with pytest.raises(InputError, match="output 'logits' is bound to a GPU array"):
        sess.run_with_iobinding(binding)


def test_device_arrays_are_read_from_dlpack_and_cuda_array_interface():
    a = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    buf = _from_dlpack(a, "input 'a'")
    assert (buf.ptr, buf.shape, buf.dtype) == (a.ctypes.data, (2, 3, 4), np.float16)
    assert device_buffer(a, "input 'a'") is None   # a host array stays a host array
    with pytest.raises(InputError, match="contiguous"):
        _from_dlpack(a[:, :, ::2], "input 'a'")

    class Strided:
        __cuda_array_interface__ = {"shape": (4, 4), "typestr": "<f4", "data": (4096, False), "version": 3,
                                    "strides": (32, 4)}
    with pytest.raises(InputError, match="contiguous"):
        device_buffer(Strided(), "input 'x'")
