"""Hardened loading: mutated bundles end in a clean GrapecError (exit code 2 in the CLI), never another
exception, a crash or a hang.

Three small bundles (two buckets of an embedding/MatMul/Softmax model, whose plans are templates plus
deltas; an If; a Loop) are mutated ROUNDS times each way:
  flip       1-8 random bytes xor-ed anywhere in the file
  truncate   the file cut at a random length
  manifest   one random place of the manifest JSON replaced by a hostile value (huge, negative, wrong
             type, deep nesting) or deleted, the manifest hash recomputed
  section    the same in the decoded plans or kernels JSON, recompressed, its section's size and
             hash and the manifest's recomputed
Each mutant is loaded and, if that succeeds, run on the CPU backend with the original bundle's
valid inputs, and shown by `grapec inspect` (plain, --json, --fusion, --schedule). An edit may be
harmless (a name changed): it runs, and is counted as such.
"""
import hashlib
import json
import signal
import struct
import subprocess
import sys
import zlib
from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper

import grapec
from click.testing import CliRunner
from grapec.bundle.format import HEADER, Bundle
from grapec.tools.cli import main as cli_main
from grapec.errors import GrapecError
from grapec.bundle.inputs import bundle_inputs
from helpers import init, model, tinfo
from test_control_flow import fibonacci_model, if_model

ROUNDS = 170   # per way and bundle: 4 ways x 3 bundles x 170 = 2040 mutants
CASE_SECONDS = 20


def _embed_model():
    rng = np.random.default_rng(0)
    return model([helper.make_node("Gather", ["table", "ids"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["m"]),
                  helper.make_node("Add", ["m", "b"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
                  helper.make_node("Softmax", ["r"], ["y"])],
                 [tinfo("ids", TensorProto.INT64, [1, "seq"])], [tinfo("y", shape=[1, "seq", 24])],
                 [init("table", rng.standard_normal((50, 16)).astype(np.float32)),
                  init("w", rng.standard_normal((16, 24)).astype(np.float32)),
                  init("b", rng.standard_normal(24).astype(np.float32))])


@pytest.fixture(scope="module")
def bundles():
    return {
        "embed": grapec.compile(_embed_model(), bucket_dims=[{"seq": 4}, {"seq": 6}], targets=[]).to_bytes(),
        "if": grapec.compile(if_model(), targets=[]).to_bytes(),
        "loop": grapec.compile(fibonacci_model(), targets=[]).to_bytes(),
    }


# --- mutations ------------------------------------------------------------------------------------

HOSTILE = [2 ** 62, -1, 0, 2 ** 31, -2 ** 63, 1e308, float("nan"), "x", "", None, True, [], {}, [[1, 2], [3]],
           "float128", {"a": 1}]


def _deep(depth: int) -> str:
    """A marker that _dumps writes as `depth` nested empty lists (json.dumps itself would recurse)."""
    return f"__deep_{depth}__"


def _dumps(doc) -> str:
    text = json.dumps(doc)
    for depth in (64, 3000, 100000):
        text = text.replace(f'"{_deep(depth)}"', "[" * depth + "]" * depth)
    return text


def _places(doc, path=()):
    """Every (path) into doc: dict keys and list indices."""
    yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _places(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:40]):   # long lists (weights offsets, template rows): their head
            yield from _places(v, path + (i,))


def mutate_json(doc, rng):
    """doc with one random place replaced by a hostile value, deleted, or nested 100000 deep."""
    places = [p for p in _places(doc) if p]
    path = places[rng.integers(len(places))]
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    roll = rng.random()
    if roll < 0.1:
        parent[path[-1]] = _deep(int(rng.choice([64, 3000, 100000])))
    elif roll < 0.25 and isinstance(parent, dict):
        del parent[path[-1]]
    elif roll < 0.4 and isinstance(parent[path[-1]], int) and not isinstance(parent[path[-1]], bool):
        parent[path[-1]] += int(rng.choice([-1, 1, 7, 256, -256, 1 << 20]))
    else:
        parent[path[-1]] = HOSTILE[rng.integers(len(HOSTILE))]
    return doc


def _header(manifest: dict) -> bytes:
    mbytes = _dumps(manifest).encode()
    return b"GRAPEC\0\n" + struct.pack("<Q", len(mbytes)) + hashlib.sha256(mbytes).digest() + mbytes


def _split(data: bytes):
    """-> (manifest, [(section name, its bytes)] in file order)."""
    (mlen,) = struct.unpack("<Q", data[8:16])
    manifest = json.loads(data[HEADER:HEADER + mlen])
    body = data[HEADER + mlen:]
    return manifest, [(s["name"], body[s["offset"]:s["offset"] + s["size"]]) for s in manifest["sections"]]


def _join(manifest: dict, sections: list) -> bytes:
    """The bundle of these sections, with the offsets, sizes and hashes in the manifest's section
    table recomputed where the mutation left that table a list of sections."""
    table = manifest.get("sections")
    entries = {s["name"]: s for s in table if isinstance(s, dict) and isinstance(s.get("name"), str)} \
        if isinstance(table, list) else {}
    off = 0
    for name, chunk in sections:
        if isinstance(entries.get(name), dict):
            entries[name].update(offset=off, size=len(chunk), sha256=hashlib.sha256(chunk).hexdigest())
        off += len(chunk)
    return _header(manifest) + b"".join(chunk for _, chunk in sections)


def mutant(data: bytes, way: str, rng) -> bytes:
    if way == "flip":
        out = bytearray(data)
        for pos in rng.integers(0, len(out), rng.integers(1, 9)):
            out[pos] ^= int(rng.integers(1, 256))
        return bytes(out)
    if way == "truncate":
        return data[:rng.integers(0, len(data))]
    manifest, sections = _split(data)
    if way == "manifest":
        return _join(mutate_json(manifest, rng), sections)
    name = "plans" if rng.random() < 0.6 else "kernels"
    sections = [(n, zlib.compress(_dumps(mutate_json(json.loads(zlib.decompress(c)), rng)).encode()) if n == name else c)
                for n, c in sections]
    return _join(manifest, sections)


# --- the test -------------------------------------------------------------------------------------

class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def _outcome(data: bytes, feeds: list, path=None) -> str:
    """'refused' (a GrapecError) or 'ran'; with a path, a mutant that loads is also shown by every
    form of `grapec inspect`, which must end in exit code 0 or 2."""
    try:
        sess = grapec.load(Bundle.from_bytes(data), backend="cpu")
    except GrapecError:
        return "refused"
    if path is not None:
        path.write_bytes(data)
        for flags in ([], ["--json"], ["--fusion"], ["--schedule"]):
            r = CliRunner().invoke(cli_main, ["inspect", *flags, str(path)])
            if r.exit_code not in (0, 2):
                raise AssertionError(f"inspect {flags}: exit {r.exit_code}: {r.output[-300:]}")
    try:
        for f in feeds:
            sess.run(f)
    except GrapecError:
        return "refused"
    return "ran"


def test_two_thousand_mutated_bundles_end_in_clean_errors(bundles, tmp_path):
    old = signal.signal(signal.SIGALRM, _alarm)
    counts, bad = Counter(), []
    try:
        for label, data in bundles.items():
            manifest = Bundle.from_bytes(data).manifest
            feeds = [bundle_inputs(manifest, i, seed=i) for i in range(len(manifest["buckets"]))]
            for way in ("flip", "truncate", "manifest", "section"):
                rng = np.random.default_rng(zlib.crc32(f"{label} {way}".encode()))
                for case in range(ROUNDS):
                    m = mutant(data, way, rng)
                    signal.alarm(CASE_SECONDS)
                    try:
                        counts[(way, _outcome(m, feeds, tmp_path / "m.grape"))] += 1
                    except _Hang:
                        bad.append((label, way, case, "hang"))
                    except BaseException as e:  # noqa: BLE001 - anything but a GrapecError is the failure sought
                        bad.append((label, way, case, f"{type(e).__name__}: {str(e)[:200]}"))
                    finally:
                        signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, old)
    total = sum(counts.values()) + len(bad)
    print(f"\n{total} mutants: {dict(sorted(counts.items()))}, {len(bad)} bad")
    assert total >= 2000
    kinds = Counter(b[3].split(":")[0] + " " + b[1] for b in bad)
    assert not bad, f"{len(bad)} mutants escaped as other exceptions: {kinds}; {bad[:12]}"
    for way in ("manifest", "section"):   # the edits must reach past the hash checks
        assert counts[(way, "refused")] > 50 and counts[(way, "ran")] > 5, counts


def test_the_cli_exits_2_on_mutants(bundles, tmp_path):
    """The same errors through the command line: one message, exit code 2, no traceback."""
    rng = np.random.default_rng(7)
    for i, way in enumerate(("flip", "truncate", "manifest", "section")):
        path = tmp_path / f"m{i}.grape"
        while True:
            data = mutant(bundles["embed"], way, rng)
            if _outcome(data, []) == "refused":
                break
        path.write_bytes(data)
        r = subprocess.run([sys.executable, "-m", "grapec.tools.cli", "run", str(path), "--backend", "cpu"],
                           capture_output=True, text=True)
        assert r.returncode == 2, (way, r.returncode, r.stderr[-800:])
        assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr[-800:]


@pytest.mark.parametrize("arena", [2 ** 62, 2 ** 50])
def test_an_arena_larger_than_the_machine_is_refused_before_allocating(bundles, arena):
    """The manifest's arena (hash recomputed) is checked against the host's available memory before
    anything is allocated: no MemoryError, no swap storm."""
    b = Bundle.from_bytes(bundles["embed"])
    b.manifest["buckets"][1]["arena_bytes"] = arena   # written into the tables section, its hash recomputed
    with pytest.raises(GrapecError, match=r"needs .* MiB of host memory \(activation arena .*\); .* MiB is available"):
        grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu")


def test_json_nested_deeper_than_a_bundle_may_is_refused_by_name(bundles):
    manifest, sections = _split(bundles["embed"])
    manifest["notes"] = [_deep(100000)]
    with pytest.raises(GrapecError, match="the manifest: JSON nested 100002 deep, more than the 64"):
        Bundle.from_bytes(_join(manifest, sections))
