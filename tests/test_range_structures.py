"""A --dynamic range compiled per launch structure (compiler/structures.py): a sample of the sizes is
compiled, the others' plans derived from formulas fitted on it. The derived plans are what compiling
those sizes gives (checked on every size of a range), they run and match onnxruntime in random order
after a write and read, and the compile needs far fewer compiles than sizes."""
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

import grapec
from grapec.bundle.format import Bundle
from grapec.compiler import compile_model, structures
from grapec.compiler.formulas import fit_numbers
from grapec.compiler.boxes import Box, band, coincident, dim_classes, initial_boxes
from helpers import gpt2_with_positions, needs_nvrtc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")
BERT = os.path.join(ROOT, "models", "tiny", "bert.onnx")
VOCAB = 256


def test_numbers_are_fitted_as_polynomials_and_round_ups_of_the_sizes():
    rng = np.random.default_rng(3)
    sizes = np.array(sorted({(int(b), int(s)) for b, s in rng.integers(1, 40, (40, 2))}))
    b, s = sizes[:, 0], sizes[:, 1]
    pitch = -(-s // 4) * 4
    ints = np.column_stack([np.full(len(b), 7), 4 * b * s * 64, b * s * s * 12 + 3 * s, pitch,
                            16 * b * s * pitch, -(-(b * s) // 256), b * 0 + 1])
    fit = fit_numbers(sizes, ints)
    assert fit.complete
    others = np.array([[50, 61], [64, 512], [3, 129]])
    ob, os_ = others[:, 0], others[:, 1]
    opitch = -(-os_ // 4) * 4
    want = np.column_stack([np.full(3, 7), 4 * ob * os_ * 64, ob * os_ * os_ * 12 + 3 * os_, opitch,
                            16 * ob * os_ * opitch, -(-(ob * os_) // 256), ob * 0 + 1])
    assert (fit.numbers(others) == want).all()
    # numbers that follow no formula are not given one
    noise = np.column_stack([ints, rng.integers(0, 1 << 20, len(b))])
    assert not fit_numbers(sizes, noise).complete
    # nor are numbers fitted over no more sizes than the formula has terms
    assert not fit_numbers(sizes[:2], np.column_stack([sizes[:2, 1] ** 2])).complete


def test_a_grid_over_a_plans_rounded_bytes_is_fitted_with_the_plans_numbers():
    """A launch row that rounds up what only the plan's formulas hold: ceil(bytes / 1024) blocks over a
    buffer of 4 x round_up(3 x batch x frames, 64) bytes, frames = floor(samples / 5) (tiny Wav2Vec2 at
    batch 1:4 x samples 1600:8000 stored 4 families' launch rows plan by plan for it). The plan's own
    fit finds the bytes; the launch rows' fit finds the grid only with the plan's variables and numbers
    (compiler/families.py fit_cuda_rows), and then gives it at sizes it did not see."""
    from grapec.compiler.floor_dims import FloorDim
    rng = np.random.default_rng(8)
    floors = [FloorDim(1, 5, 0).variable(2)]

    def numbers(sz):   # the plan's: a buffer's elements, padded to 64, and its bytes; the grid
        f = sz[:, 1] // 5
        padded = -(-(3 * sz[:, 0] * f) // 64) * 64
        return np.column_stack([3 * sz[:, 0] * f, padded, 4 * padded]), -(-(4 * padded) // 1024)
    sizes = np.array(sorted({(int(b), int(x)) for b, x in zip(rng.integers(1, 5, 60), rng.integers(1600, 8000, 60))}))
    plan, grid = numbers(sizes)
    plan_fit = fit_numbers(sizes, plan, floors)
    assert plan_fit.complete
    assert not fit_numbers(sizes, grid[:, None], floors).complete
    rows = fit_numbers(sizes, grid[:, None], plan_fit.extra, plan_fit.slots)
    assert rows.complete
    others = np.array([[1, 1601], [4, 7999], [3, 5555], [2, 4099]])
    assert (rows.numbers(others)[:, 0] == numbers(others)[1]).all()


def test_boxes_cover_every_size_once():
    ranges = [(1, 20), (3, 40)]
    boxes = initial_boxes(ranges)
    members = [m for b in boxes for m in b.members()]
    assert sorted(members) == [(x, y) for x in range(1, 21) for y in range(3, 41)]
    # no class straddles 64, 256 or 1024, where block sizes step (ops/reduce.py)
    classes = dim_classes(1, 300)
    assert sorted(v for c in classes for v in c) == list(range(1, 301))
    assert all(len({band(v) for v in c}) == 1 for c in classes) and band(256) == 1 and band(257) == 2
    box = Box(((9, 17, 25, 33), (11, 19, 27)))
    low, high = box.split_at(0, 2, same_structure=False)
    assert sorted(list(low.members()) + list(high.members())) == sorted(box.members())
    assert high.like == box.top and low.like == low.top
    assert all(h.like == box.top for h in box.halves())


def test_a_part_with_no_compiled_size_of_its_structure_is_not_cut_at_a_step():
    """A box's half may hold compiled sizes of other structures only (Wav2Vec2's samples, whose frame
    counts step every few hundred samples): there is no step to find in it, and the range compile goes
    on to the box's own halves instead of failing (it stopped with an IndexError)."""
    box = Box(((1600, 1601, 1602, 1603),))
    assert structures._split_at_step([box], [], None) is None


def test_coincident_sizes_are_never_probed_and_a_box_is_led_by_its_largest_other_size():
    """batch == seq: the compile merges equal Range nodes and constants, so such a size's template is
    its own though it runs as its neighbours' would; probing it would cut boxes for nothing."""
    square = Box((tuple(range(1, 9)), tuple(range(1, 9))))
    assert square.top == (8, 7)
    assert square.probes() and not any(coincident(p) for p in square.probes())
    assert Box(((5,), (5,))).top == (5, 5) and Box(((5,), (5,))).probes() == [(5, 5)]


def test_every_derived_plan_is_what_compiling_its_size_gives(monkeypatch):
    """With as many checks as sizes, every size the first round would derive is also compiled (with its
    box's choices) and compared number for number: none differs."""
    monkeypatch.setattr(structures, "CHECKS", 10_000)
    said = []
    compile_model(GPT2, dynamic={"batch": (1, 2), "seq": (1, 40)}, targets=[], progress=said.append)
    summary = [m for m in said if m.startswith("--dynamic batch=1:2, seq=1:40")]
    assert summary and "80 sizes in" in summary[0] and "0 derived" in summary[0], said
    assert not [m for m in said if "differ from their derived plans" in m], said


@pytest.fixture(scope="module")
def sampled():
    said = []
    b = compile_model(GPT2, dynamic={"batch": (1, 2), "seq": (1, 64)}, targets=[], progress=said.append, jobs=2)
    return b, said


def test_a_sampled_range_compiles_a_part_and_derives_the_rest(sampled):
    """A range this small has few sizes per box (boxes cut at seq 64 and per remainder): most are
    compiled, as probes or to fit; some are derived."""
    b, said = sampled
    derived = [m for m in b.manifest["buckets"] if m.get("derived")]
    assert len(b.plans) == 128 and len(derived) >= 10, len(derived)
    line = next(m for m in said if m.startswith("--dynamic"))
    assert f"{128 - len(derived)} compiled" in line and f"{len(derived)} derived" in line, line
    coincident = [m for m in b.manifest["buckets"] if len(set(m["shapes"]["input_ids"])) == 1]
    assert len(coincident) == 2 and not any(m.get("derived") for m in coincident)
    assert not [m for m in said if "differ from their derived plans" in m], said


def test_compiled_and_derived_plans_of_a_structure_share_its_template(sampled):
    """The runtime gives each plan template an exec of its own (runtime/cuda/shared_exec.py): a derived
    plan whose template differed from its compiled siblings' (a memory report or an estimate that only
    the compiled ones carry) would double the execs and their memory. It once did (GPT-2 full, 1..512:
    73 execs instead of 26, over the memory the issue allows)."""
    b, _ = sampled
    rb = Bundle.from_bytes(b.to_bytes())
    kinds: dict = {}
    for i in range(len(rb.plans)):
        template = rb.plans.docs.template_of(i)
        kinds.setdefault(template, set()).add(bool(b.manifest["buckets"][i].get("derived")))
    assert any(k == {True, False} for k in kinds.values())
    assert not [k for k in kinds.values() if k == {True}], "a template only derived plans have"

    # ... and one arena layout: a plan at other offsets would leave every kernel touching a buffer it
    # moved unsized among its structure's (GPT-2 full, 97..320: 97 nodes set at each switch)
    layouts: dict = {}
    for i in range(len(rb.plans)):
        template = rb.plans.docs.template_of(i)
        layouts.setdefault(template, set()).add(tuple(x.offset for x in rb.plans[i].buffers if x.space == "arena"))
    assert all(len(v) == 1 for v in layouts.values()), [len(v) for v in layouts.values()]


def test_a_sampled_range_matches_onnxruntime_in_random_order_after_a_round_trip(sampled):
    b, _ = sampled
    sess = grapec.load(Bundle.from_bytes(b.to_bytes()), backend="cpu")
    ref = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    derived = [tuple(m["shapes"]["input_ids"]) for m in b.manifest["buckets"] if m.get("derived")]
    picks = [derived[i] for i in rng.choice(len(derived), 12, replace=False)] + [(1, 1), (2, 64), (1, 17), (2, 8)]
    for batch, seq in [picks[i] for i in rng.permutation(len(picks))]:
        feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)}
        got, want = sess.run(feeds)["logits"], ref.run(None, feeds)[0]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert got.shape == want.shape and rel < 1e-5 and np.abs(got - want).max() < 1e-4, (batch, seq, rel)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_derived_sizes_are_stored_as_their_structures_formulas_and_joined_when_run(sampled):
    """bundle/families.py: a structure's derived sizes are written as its template and formulas (no plan,
    kernel or launch row per size), joined when a size is first run, in process and after a write and
    read alike; a joined size's plan is the one the range compile derived for it, number for number."""
    from grapec.bundle.families import BucketDocs
    from grapec.compiler.families import numbered_template
    b, said = sampled
    line = next(m for m in said if m.startswith("--dynamic"))
    assert "stored as the formulas of" in line, line
    docs = b.plans.docs
    assert isinstance(docs, BucketDocs) and docs.families
    members = [bk for f in docs.families for bk in f.buckets]
    assert len(members) >= 16 and len(docs.stored) + len(members) == len(b.plans) == 128
    data = b.to_bytes()
    rb = Bundle.from_bytes(data)
    assert "families" in {s["name"] for s in rb.manifest["sections"]}
    assert len(rb.kernels) == rb.plans.docs.stored_kernels   # nothing joined yet: no kernel per member stored
    assert rb.kernels.joined == 0   # a read bundle's kernels are joined when a run needs them, not at read
    rng = np.random.default_rng(8)
    ref = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"])
    sessions = [grapec.load(b, backend="cpu"), grapec.load(rb, backend="cpu")]
    for bk in rng.permutation(members)[:10]:
        batch, seq = b.manifest["buckets"][bk]["shapes"]["input_ids"]
        feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)}
        want = ref.run(None, feeds)[0]
        for sess in sessions:
            got = sess.run(feeds)["logits"]
            rel = np.linalg.norm(got - want) / np.linalg.norm(want)
            assert rel < 1e-5 and np.abs(got - want).max() < 1e-4, (batch, seq, rel)
    assert len(rb.kernels) > rb.plans.docs.stored_kernels   # the members run joined their kernels
    assert Bundle.from_bytes(rb.to_bytes()).to_bytes() == data   # joined members are not written back
    fam = docs.families[0]
    numbered = numbered_template(fam.plan.template)
    assert numbered["plan"]["buffers"][0][2:4] == [0, 1]   # the first buffer's offset and bytes: the first numbers


def test_a_cpu_session_of_a_large_bundle_decodes_only_the_kernels_it_runs(sampled, monkeypatch):
    """A range of 32768 sizes holds 200k kernels: read and decoded all at load they took 60 s (1 s per
    3500); past DecodedKernels.EAGER_KERNELS each is joined and decoded when a run first needs it."""
    from grapec.runtime.cpu.runner import DecodedKernels
    monkeypatch.setattr(DecodedKernels, "EAGER_KERNELS", 0)
    b, _ = sampled
    rb = Bundle.from_bytes(b.to_bytes())
    sess = grapec.load(rb, backend="cpu")
    feeds = {"input_ids": np.random.default_rng(2).integers(0, VOCAB, (2, 37)).astype(np.int64)}
    want = ort.InferenceSession(GPT2, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(sess.run(feeds)["logits"], want, rtol=1e-4, atol=1e-5)
    assert 0 < rb.kernels.joined < len(rb.kernels) / 10, (rb.kernels.joined, len(rb.kernels))


def test_every_size_compiles_each_size(monkeypatch):
    monkeypatch.setattr(structures, "SAMPLE_OVER", 4)   # a range of 8 sizes would be sampled ...
    monkeypatch.setattr("grapec.compiler.pipeline.SAMPLE_OVER", 4)
    said = []
    b = compile_model(GPT2, dims={"batch": 1}, dynamic={"seq": (9, 16)}, targets=[], progress=said.append,
                      every_size=True)   # ... but not with every_size
    assert len(b.plans) == 8 and not [m for m in b.manifest["buckets"] if m.get("derived")]
    assert not [m for m in said if m.startswith("--dynamic")]
    said.clear()
    compile_model(GPT2, dims={"batch": 1}, dynamic={"seq": (9, 16)}, targets=[], progress=said.append)
    assert [m for m in said if m.startswith("--dynamic seq=9:16: 8 sizes in")], said


def test_inspect_shows_a_sampled_range(sampled, tmp_path):
    """The plans of a sampled range carry no memory report (derived ones have none to carry): inspect
    shows their arenas without it, as it does every other bundle."""
    b, _ = sampled
    path = tmp_path / "range.grape"
    b.write(str(path))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    r = subprocess.run([sys.executable, "-m", "grapec.tools.cli", "inspect", str(path)], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert "128 sizes" in r.stdout and "no memory report per size" in r.stdout, r.stdout


def test_a_buffer_fits_its_slot_of_the_largest_layout_up_to_the_planners_alignment():
    """A structure's layout is its largest member's; a member's buffer that holds a few bytes more there
    (GPT-2 full: a count of blocks' partial sums, 88 bytes at seq 161, 80 at seq 320) still fits the
    256 bytes the planner gave it, but not past them, nor where it is a view inside another buffer."""
    from grapec.compiler.shared_layout import fits_slot
    from grapec.plan import Buffer
    slot = Buffer("t", "arena", 512, 80, "int32", (20,))
    assert fits_slot(Buffer("t", "arena", 0, 88, "int32", (22,)), slot)
    assert not fits_slot(Buffer("t", "arena", 0, 260, "int32", (65,)), slot)
    view = Buffer("t", "arena", 520, 80, "int32", (20,))
    assert not fits_slot(Buffer("t", "arena", 0, 88, "int32", (22,)), view)
    assert fits_slot(Buffer("t", "arena", 0, 80, "int32", (20,)), view)


def test_a_structure_computes_as_many_elements_a_thread_in_all_its_sizes(monkeypatch):
    """An element kernel of ELEMENTS_PER_THREAD_FROM elements or more gives each thread four
    (codegen/launch.py), another function. A structure whose kernels crossed that size ran two, and its
    derived sizes fell back from formulas to a plan each (GPT-2 64 x 512: 12355 sizes, most of the
    compile's time). A size now takes its structure's largest size's choice, and the plan says it."""
    from grapec.codegen import launch
    from grapec.plan import KernelStep, walk_steps
    monkeypatch.setattr(launch, "ELEMENTS_PER_THREAD_FROM", 2048)   # crossed inside tiny GPT-2's range
    b = compile_model(GPT2, dynamic={"batch": (1, 2), "seq": (1, 48)}, targets=[], jobs=1)
    rb = Bundle.from_bytes(b.to_bytes())
    per: dict = {}   # plan template -> the elements a thread of each element-mode kernel step, per size
    for i in range(len(rb.plans)):
        steps = [st for st in walk_steps(rb.plans[i].steps) if isinstance(st, KernelStep)]
        kernels = [rb.kernels[st.kernel] for st in steps]
        row = tuple(k["mapping"][2] if len(k.get("mapping") or ()) > 2 else launch.per_thread_for(int(np.prod(k["shape"])))
                    for k in kernels if "kind" not in k and (k.get("mapping") or ["element"])[0] == "element")
        per.setdefault(rb.plans.docs.template_of(i), set()).add(row)
    # (compiled sizes of one template may run other kernels: the runtime keys on them too, shared_exec.py)
    derived = {rb.plans.docs.template_of(i) for i, m in enumerate(rb.manifest["buckets"]) if m.get("derived")}
    assert derived and all(len(per[t]) == 1 for t in derived), [len(per[t]) for t in derived]
    pinned = [k for k in rb.kernels if (k.get("mapping") or [])[2:] == [4] and np.prod(k["shape"]) < 2048]
    assert pinned   # smaller sizes of a structure whose largest computes four a thread do so too


def test_a_structures_sizes_run_one_attention_function():
    """The fused attention kernel's tiling (warps, key slices, keys a step: codegen/attention.py) follows
    its lengths. Sizes of one structure that tiled differently ran different GPU functions, so no formula
    named their function, and a structure's derived sizes were stored plan by plan (BERT fp16 seq
    1..512: 428 of 434). The kernel now records its tiling, so a plan names its function: the range is
    cut where the tiling changes, and every structure's sizes run one."""
    from grapec.plan import KernelStep, walk_steps
    needs_nvrtc()
    said = []
    b = compile_model(BERT, dynamic={"batch": (1, 2), "seq": (1, 64)}, precision="fp16", progress=said.append, jobs=2)
    assert not any("stored plan by plan" in m for m in said), [m for m in said if "plan by plan" in m]
    line = next(m for m in said if m.startswith("--dynamic"))
    # a structure of fewer derived sizes than a family takes (families.FAMILY_MIN) is stored plan by plan by
    # design, each plan naming its function (a size that takes its structure's attention tiling only where
    # it is priced close leaves such pieces); no other reason is allowed
    why = line.split("derived sizes stored as plans: ")[1].split(" (and ")[0] if "stored as plans" in line else ""
    assert "stored as the formulas of" in line, line
    assert all(w.strip().endswith(" derived sizes") for w in why.split(";") if w.strip()), line
    rb = Bundle.from_bytes(b.to_bytes())

    def tiling(i):   # of the size's attention kernels, recorded wherever attention is fused
        return tuple(tuple(k["tiling"]) for k in (rb.kernels[st.kernel] for st in walk_steps(rb.plans[i].steps)
                                                   if isinstance(st, KernelStep)) if k.get("kind") == "attention")
    tilings = [{tiling(bk) for bk in f.buckets} for f in rb.plans.docs.families]
    assert tilings and all(len(v) == 1 and all(next(iter(v))) for v in tilings), tilings
    assert len({tiling(i) for i in range(len(rb.plans))} - {()}) > 1   # the range crosses a change of tiling


def test_a_buffer_largest_at_another_size_widens_its_structures_layout(tmp_path):
    """A structure's layout is its largest size's (by its buffers' bytes), but not every buffer is largest
    there: the position table's rows grow with seq alone, while batch x seq makes a size largest. Such a
    size kept its own layout (at run time a structure of its own), and a derived size past the layout's
    bytes was compiled again or stored plan by plan (GPT-2 64 x 512: 35 and 11670 of them). Now the
    layout is widened: that buffer gets bytes of its own past the arena's end, as many as any size needs,
    and every size of the structure sits at one layout, all of them equal to onnxruntime."""
    import json
    from grapec.bundle.templates import split
    from grapec.plan import KernelStep, walk_steps
    model = gpt2_with_positions(128, str(tmp_path / "gpt2_128.onnx"))
    said = []
    b = compile_model(model, dynamic={"batch": (1, 4), "seq": (1, 128)}, targets=[], progress=said.append, jobs=2)
    line = next(m for m in said if m.startswith("--dynamic"))
    # without widening: (2, 127), (2, 128) and (3, 128) kept their own layouts (embedding_1 32768 bytes
    # at (3, 128), 31744 at (4, 124))
    assert "keep their own arena layout" not in line and "layouts widened" in line, line
    rb = Bundle.from_bytes(b.to_bytes())
    layouts: dict = {}   # a structure (its plan's and kernels' templates: compiler/structures.py) -> its layouts
    for i in range(len(rb.plans)):
        kernels = tuple(json.dumps(split(rb.kernels[st.kernel])[0]) for st in walk_steps(rb.plans[i].steps)
                        if isinstance(st, KernelStep))
        layouts.setdefault((rb.plans.docs.template_of(i), kernels), set()).add(
            tuple(x.offset for x in rb.plans[i].buffers if x.space == "arena"))
    assert all(len(v) == 1 for v in layouts.values()), [len(v) for v in layouts.values()]
    sess, ref = grapec.load(rb, backend="cpu"), ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    for shape in [(3, 128), (2, 127), (2, 128), (4, 124), (1, 128), (3, 97), (4, 61)]:
        feeds = {"input_ids": rng.integers(0, VOCAB, shape).astype(np.int64)}
        want, got = ref.run(None, feeds)[0], sess.run(feeds)["logits"]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 1e-5 and np.allclose(got, want, rtol=1e-4, atol=1e-4), (shape, rel)


def test_floors_of_a_dim_are_found_from_the_models_shapes():
    """floor_dims.py: a length floor((x + o) / p) * a + c is told from a polynomial and found exactly
    (two consecutive steps); one that is not such a floor is left out."""
    from grapec.compiler.floor_dims import FloorDim, floor_dims
    lengths = {"conv": lambda x: (x - 10) // 5 + 1, "stack": lambda x: ((x - 10) // 5 + 1 - 3) // 2 + 1,
               "pitch": lambda x: -(-x // 4) * 4, "twice": lambda x: 2 * ((x + 3) // 7), "same": lambda x: 3 * x + 1,
               "sum": lambda x: x // 3 + x // 7}
    calls = []

    def dims_at(size):
        calls.append(size)
        return {(k, 0): f(size[0]) for k, f in lengths.items()}
    found = floor_dims(dims_at, [(100, 5000)])
    assert set(found) == {FloorDim(0, 5, 0, 1, -1), FloorDim(0, 10, 0, 1, -1), FloorDim(0, 4, 3, 4, 0),
                          FloorDim(0, 7, 3, 2, 0)}, found
    xs = np.arange(100, 5001)
    of = {"conv": 5, "stack": 10, "pitch": 4, "twice": 7}
    for k, p in of.items():   # each found exactly, over the whole range
        f = next(f for f in found if f.p == p)
        assert [f.at(int(x)) for x in xs] == [lengths[k](int(x)) for x in xs], k
        assert (f.variable(1).values(xs[:, None]) == (xs + f.o) // f.p).all()   # the formulas' variable
    assert len(calls) < 200


def test_a_wav2vec2_samples_range_compiles_per_structure_and_matches_onnxruntime(tmp_path):
    """Wav2Vec2's frames are floors of its samples (strided convolutions), its GroupNorm divides by one of
    them, and its row groups are padded at 3 of 4 lengths: every number of its plans once followed no
    formula, and a samples range compiled size by size (1600:16000 was cut off after 480 s with 7487 of
    14401 compiled). The floors are now variables of the formulas, found from the model's shapes: few
    sizes are compiled, and random ones match onnxruntime after a write and read."""
    model = os.path.join(ROOT, "models", "tiny", "wav2vec2.onnx")
    said = []
    b = compile_model(model, dims={"batch": 1}, dynamic={"samples": (1600, 4000)}, targets=[], progress=said.append,
                      jobs=2)
    assert any("floor((samples + 0) / 20)" in m for m in said), said
    line = next(m for m in said if m.startswith("--dynamic"))
    compiled = int(line.split(" compiled")[0].split()[-1])
    assert compiled < 2401 // 6, line
    path = tmp_path / "w2v.grape"
    b.write(str(path))
    r = subprocess.run([sys.executable, "-m", "grapec.tools.cli", "inspect", str(path)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src")))
    assert r.returncode == 0 and "floors of the dims: floor((samples + 0) / 5), floor((samples + 0) / 10)" in r.stdout \
        and f"{compiled} compiled" in r.stdout, r.stdout + r.stderr   # how the range was compiled, in the bundle
    _audio_lengths_match(Bundle.read(str(path)), model, (1600, 4000), "last_hidden_state", seed=17)


def _audio_lengths_match(bundle, model: str, span: tuple, output: str, seed: int):
    """8 random lengths of random audio through the bundle on the CPU backend, equal to onnxruntime."""
    sess, ref = grapec.load(bundle, backend="cpu"), ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    for x in rng.integers(span[0], span[1] + 1, 8):
        feeds = {"input_values": rng.standard_normal((1, int(x))).astype(np.float32)}
        want, got = ref.run(None, feeds)[0], sess.run(feeds)[output]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 1e-5 and np.allclose(got, want, rtol=1e-4, atol=1e-4), (x, rel)


def _conv_stack(path: str) -> str:
    """Wav2Vec2-base's feature extractor in miniature (kernels 10,3,3,3,3,2,2, strides 5,2,2,2,2,2,2, 8
    channels; InstanceNorm after the first), then a frames x frames attention: seven floors of the samples."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Unsqueeze", ["input_values", "ax1"], ["g"])]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "ax1"),
             numpy_helper.from_array(np.ones(8, np.float32), "gs"), numpy_helper.from_array(np.zeros(8, np.float32), "gb"),
             numpy_helper.from_array((rng.standard_normal((8, 16)) / 3).astype(np.float32), "wp")]
    prev, cin = "g", 1
    for i, (k, s) in enumerate(zip((10, 3, 3, 3, 3, 2, 2), (5, 2, 2, 2, 2, 2, 2))):
        inits.append(numpy_helper.from_array((rng.standard_normal((8, cin, k)) / np.sqrt(cin * k)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], strides=[s], kernel_shape=[k]))
        if i == 0:
            nodes.append(helper.make_node("InstanceNormalization", ["c0", "gs", "gb"], ["n0"]))
        nodes.append(helper.make_node("Gelu", ["n0" if i == 0 else f"c{i}"], [f"a{i}"]))
        prev, cin = f"a{i}", 8
    nodes += [helper.make_node("Transpose", [prev], ["t"], perm=[0, 2, 1]), helper.make_node("MatMul", ["t", "wp"], ["p"]),
              helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 2, 1]), helper.make_node("MatMul", ["p", "pt"], ["s"]),
              helper.make_node("Softmax", ["s"], ["e"], axis=-1), helper.make_node("MatMul", ["e", "p"], ["y"])]
    g = helper.make_graph(nodes, "conv_stack", [helper.make_tensor_value_info("input_values", TensorProto.FLOAT, ["batch", "samples"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9), path)
    return path


def test_a_seven_convolution_front_end_compiles_per_structure_over_its_samples(tmp_path):
    """The full Wav2Vec2's seven strided convolutions give floors of the samples with periods up to 320 and
    phases other than 0 (floor((x + 240) / 320)): all found, and a samples range compiles a few hundred of
    its sizes and matches onnxruntime at random lengths after a write and read."""
    model = _conv_stack(str(tmp_path / "conv_stack.onnx"))
    said = []
    b = compile_model(model, dims={"batch": 1}, dynamic={"samples": (400, 3600)}, targets=[], progress=said.append, jobs=2)
    floors = next(m for m in said if "floors of the dims" in m)
    assert all(f"/ {p})" in floors for p in (5, 10, 20, 40, 80, 160, 320)), floors
    line = next(m for m in said if m.startswith("--dynamic"))
    assert int(line.split(" compiled")[0].split()[-1]) < 3201 // 6, line
    _audio_lengths_match(Bundle.from_bytes(b.to_bytes()), model, (400, 3600), "y", seed=18)


def test_every_size_of_a_batch_by_samples_range_is_a_valid_plan():
    """batch x samples: a buffer's bytes are 128 x batch x floor(x / 20)-ish, a product of a dim and a floor.
    Compiled sizes that did not span such products fitted a formula that is wrong elsewhere: 39 members of
    one family (batch 1:3 x samples 1600:2800) joined to plans whose buffer bytes do not match their shapes,
    which a run of those sizes would refuse. Every family member now joins to a plan that passes the
    bundle's checks, and random sizes match onnxruntime."""
    model = os.path.join(ROOT, "models", "tiny", "wav2vec2.onnx")
    b = compile_model(model, dynamic={"batch": (1, 3), "samples": (1600, 2800)}, targets=[], jobs=2)
    rb = Bundle.from_bytes(b.to_bytes())
    members = [bk for f in rb.plans.docs.families for bk in f.buckets]
    assert len(members) > len(rb.plans) // 2
    for i in members:
        rb.check_plan(i, rb.plans[i])
    sess, ref = grapec.load(rb, backend="cpu"), ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(19)
    for _ in range(6):
        feeds = {"input_values": rng.standard_normal((int(rng.integers(1, 4)), int(rng.integers(1600, 2801)))).astype(np.float32)}
        want, got = ref.run(None, feeds)[0], sess.run(feeds)["last_hidden_state"]
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4), feeds["input_values"].shape
