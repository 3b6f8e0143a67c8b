"""Bundle format v1: round trip, atomic writes, and clear errors for damaged or foreign files."""
import hashlib
import json
import os
import struct

import numpy as np
import pytest
import onnx
from onnx import helper

import grapec
from grapec.bundle.format import FORMAT_VERSION, HEADER, MAGIC, Bundle
from grapec.errors import BundleError
from helpers import init, model, tinfo


def small_bundle():
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
              [tinfo("x", shape=["batch", 16])], [tinfo("y")], [init("w", w)])
    return grapec.compile(m, dims={"batch": 2}), w


def test_round_trip_runs_the_same(tmp_path):
    b, w = small_bundle()
    p = tmp_path / "m.grape"
    b.write(str(p))
    sess = grapec.load(str(p))
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_allclose(sess.run({"x": x})["y"], np.tanh(x @ w), rtol=1e-5, atol=1e-6)
    m = Bundle.read(str(p)).manifest
    assert m["format_version"] == FORMAT_VERSION
    assert [i["name"] for i in m["inputs"]] == ["x"] and m["inputs"][0]["dims"] == ["batch", 16]
    assert {s["name"] for s in m["sections"]} >= {"weights", "kernels", "plans"}
    assert p.read_bytes() == b.to_bytes()   # written section by section, the same bytes as one buffer


def test_a_read_bundle_keeps_its_weights_in_the_mapped_file(tmp_path):
    """Bundle.read maps the file: the weights are a view of its pages (a 2.5 GB model loads in 2.4 GB
    resident, not 4.8), checked against their sha256 as before, and a flipped weight byte is refused."""
    b, w = small_bundle()
    p = tmp_path / "m.grape"
    b.write(str(p))
    r = Bundle.read(str(p))
    assert isinstance(r.weights, memoryview) and r.weights.readonly
    assert bytes(r.weights) == bytes(b.weights)
    x = np.random.default_rng(2).standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_allclose(grapec.load(r, backend="cpu").run({"x": x})["y"], np.tanh(x @ w), rtol=1e-5, atol=1e-6)
    data = bytearray(p.read_bytes())
    mlen = struct.unpack("<Q", data[8:16])[0]
    data[HEADER + mlen + 3] ^= 0x40   # the weights come first after the manifest
    p.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="'weights' fails its sha256"):
        Bundle.read(str(p))
    (tmp_path / "empty.grape").write_bytes(b"")
    with pytest.raises(BundleError, match="not a grapec bundle"):
        Bundle.read(str(tmp_path / "empty.grape"))


def test_truncated_by_one_byte_is_refused():
    data = small_bundle()[0].to_bytes()
    with pytest.raises(BundleError, match="truncated|corrupted"):
        Bundle.from_bytes(data[:-1])


@pytest.mark.parametrize("where", ["manifest", "weights", "end"])
def test_one_flipped_byte_is_refused(where):
    b = small_bundle()[0]
    data = bytearray(b.to_bytes())
    mlen = struct.unpack("<Q", data[8:16])[0]
    pos = {"manifest": HEADER + mlen // 2, "weights": HEADER + mlen + 10, "end": len(data) - 1}[where]
    data[pos] ^= 0x01
    with pytest.raises(BundleError):
        Bundle.from_bytes(bytes(data))


def test_every_single_byte_flip_is_caught():
    """Not just three places: the whole header and a random sample of every other byte."""
    data = small_bundle()[0].to_bytes()
    rng = np.random.default_rng(3)
    positions = list(range(0, 80)) + sorted(rng.choice(len(data), 300, replace=False).tolist())
    for pos in positions:
        bad = bytearray(data)
        bad[pos] ^= 0x20
        with pytest.raises(BundleError):
            Bundle.from_bytes(bytes(bad))


def test_foreign_file_and_newer_version(tmp_path):
    p = tmp_path / "x.grape"
    p.write_bytes(b"\x08\x01\x12\x04onnx-like protobuf bytes")
    with pytest.raises(BundleError, match="not a grapec bundle"):
        Bundle.read(str(p))
    b = small_bundle()[0]
    data = b.to_bytes()
    mlen = struct.unpack("<Q", data[8:16])[0]
    man = json.loads(data[HEADER:HEADER + mlen])
    man["format_version"] = FORMAT_VERSION + 1
    mb = json.dumps(man).encode()
    newer = MAGIC + struct.pack("<Q", len(mb)) + hashlib.sha256(mb).digest() + mb + data[HEADER + mlen:]
    with pytest.raises(BundleError, match="upgrade grapec"):
        Bundle.from_bytes(newer)


def test_plan_offsets_are_validated():
    b = small_bundle()[0]
    b.plans[0].buffers[0].offset = b.plans[0].arena_bytes + 4096   # past the arena
    with pytest.raises(BundleError, match="outside its arena"):
        Bundle.from_bytes(b.to_bytes())
    b = small_bundle()[0]
    b.plans[0].steps[0].args[0] = 999
    with pytest.raises(BundleError, match="out of range"):
        Bundle.from_bytes(b.to_bytes())


def test_write_is_atomic(tmp_path, monkeypatch):
    b = small_bundle()[0]
    p = tmp_path / "m.grape"
    p.write_bytes(b"previous contents")

    def boom(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(BundleError, match=f"cannot write {p}: disk full"):
        b.write(str(p))
    assert p.read_bytes() == b"previous contents"
    assert [f.name for f in tmp_path.iterdir()] == ["m.grape"]   # no temp file left behind


def test_bundle_travels_without_weights_and_is_restored_byte_for_byte(tmp_path):
    """tools/bundle_weights.py: how CPU-compiled full-size bundles reach the GPU machine."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tool = os.path.join(root, "tools", "bundle_weights.py")
    src = os.path.join(root, "models", "tiny", "gpt2.onnx")
    grapec.compile(src, dims={"batch": 1, "seq": 8}).write(str(tmp_path / "a.grape"))   # with GPU code where NVRTC is
    grapec.compile(src, dims={"batch": 1, "seq": 8}, targets=[]).write(str(tmp_path / "donor.grape"))
    run = lambda *a: subprocess.run([sys.executable, tool, *map(str, a)], capture_output=True, text=True)  # noqa: E731
    assert run("strip", tmp_path / "a.grape", tmp_path / "a.nw").returncode == 0
    assert os.path.getsize(tmp_path / "a.nw") < os.path.getsize(tmp_path / "a.grape") / 3
    r = run("restore", tmp_path / "a.nw", tmp_path / "b.grape", "--donor", tmp_path / "donor.grape")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "a.grape").read_bytes() == (tmp_path / "b.grape").read_bytes()
    r = run("restore", tmp_path / "a.nw", tmp_path / "c.grape", "--models", os.path.dirname(src))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "a.grape").read_bytes() == (tmp_path / "c.grape").read_bytes()
    m = onnx.load(src)
    m.graph.initializer[0].raw_data = bytes(len(m.graph.initializer[0].raw_data))   # other weights
    grapec.compile(m, dims={"batch": 1, "seq": 8}, targets=[]).write(str(tmp_path / "other.grape"))
    r = run("restore", tmp_path / "a.nw", tmp_path / "d.grape", "--donor", tmp_path / "other.grape")
    assert r.returncode != 0 and "not the ones" in r.stderr and not (tmp_path / "d.grape").exists()


def test_a_value_range_bounded_by_another_inputs_dim():
    """grapec.input_range.<name> = "lo:NAME[axis]": at most NAME's size along axis in the same run (a
    generation's prompt lengths within its prompt's width, whatever bucket runs)."""
    from onnx import TensorProto
    from grapec.bundle.inputs import random_inputs, value_ranges
    from grapec.bundle.value_range import ValueRange
    from grapec.errors import InputError
    r = ValueRange(1, None, "m", ("ids", 1))
    assert ValueRange.from_json(json.loads(json.dumps(r.to_json()))) == r
    assert r.bounded({"ids": (2, 6)}).hi == 6 and ValueRange(1, 4, "m", ("ids", 1)).bounded({"ids": (2, 9)}).hi == 4
    for bad in (["ids"], ["ids", -1], [3, 1], ["ids", True]):
        with pytest.raises(ValueError, match="malformed value_range"):
            ValueRange.from_json({"lo": 1, "hi": None, "source": "", "hi_dim": bad})
    m = model([helper.make_node("Add", ["n", "ids"], ["y"])],
              [tinfo("ids", TensorProto.INT64, [2, "w"]), tinfo("n", TensorProto.INT64, [2, 1])], [tinfo("y", TensorProto.INT64)])
    m.metadata_props.add(key="grapec.input_range.n", value="1:ids[1]")
    assert value_ranges(m)["n"] == ValueRange(1, None, "model metadata grapec.input_range.n", ("ids", 1))
    feeds = random_inputs({"n": (2, 1)}, {"n": "int64"}, value_ranges(m), seed=3, run_shapes={"n": (2, 1), "ids": (2, 3)})
    assert 1 <= feeds["n"].min() and feeds["n"].max() <= 3
    sess = grapec.load(grapec.compile(m, dims={"w": 3}, targets=[]))
    with pytest.raises(InputError, match=r"input 'n' holds 4, outside the valid range 1\.\.3"):
        sess.run({"ids": np.zeros((2, 3), np.int64), "n": np.array([[1], [4]])})
    m.metadata_props[0].value = "1:idz[1]"
    with pytest.raises(InputError, match="expected 'lo:hi' with integers lo <= hi, hi possibly an input's dim"):
        value_ranges(m)
