"""How a range family's sizes run on the GPU from its formulas (runtime/cuda/family_plan.py), worked out on
the host: every step of tiny Wav2Vec2's families is a sized kernel or a library call that runs at its band's
widest or as one of a few shape variants; the shapes the formulas give are the joined plans' own; the widest
cover every member; and a family whose attributes differ between sizes says so instead of running."""
import os

import numpy as np
import pytest

from grapec.bundle.format import Bundle
from grapec.compiler import compile_model
from grapec.plan import KernelStep, LibraryStep
from grapec.runtime.cuda.family_plan import plan_family

pytest.importorskip("cuda.bindings.nvrtc", reason="needs NVRTC (pip install cuda-bindings nvidia-cuda-nvrtc)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
W2V = os.path.join(ROOT, "models", "tiny", "wav2vec2.onnx")


SAID: dict = {}   # precision -> what its compile said


def _range(precision: str) -> Bundle:
    said = SAID[precision] = []
    b = compile_model(W2V, dims={"batch": 1}, dynamic={"samples": (1600, 4000)}, targets=["sm_90"], jobs=2,
                      precision=precision, progress=said.append)
    return Bundle.from_bytes(b.to_bytes())


@pytest.fixture(scope="module")
def fp16_range():
    return _range("fp16")


def _plans(bundle):
    sized = set(bundle.manifest["cuda"]["sized"])
    return [plan_family(f, sized) for f in bundle.plans.docs.families]


def test_every_fp16_family_runs_from_its_formulas(fp16_range):
    assert b"grapec_eval_sizes" in fp16_range.extra_sections["cuda.source"]   # the loader is in the module
    plans = _plans(fp16_range)
    assert plans
    for fp in plans:
        assert fp.reason is None, fp.reason
        steps = fp16_range.plans[fp.family.buckets[0]].steps
        assert fp.sized == [p for p, st in enumerate(steps) if isinstance(st, KernelStep)]
        assert sorted(fp.library) == [p for p, st in enumerate(steps) if isinstance(st, LibraryStep)]
        kinds = {form.kind for form in fp.library.values()}
        assert "widest" in kinds and "variant" in kinds   # the strided convolutions; the first one's GEMM


def test_the_formulas_shapes_are_the_joined_plans_and_the_widest_cover_them(fp16_range):
    docs = fp16_range.plans.docs
    rng = np.random.default_rng(3)
    for fp in _plans(fp16_range):
        for band in sorted(set(fp.bands.tolist())):
            members = fp.members(band)
            picks = sorted({int(members[0]), int(members[-1])} | {int(m) for m in rng.choice(members, 3)})
            for m in picks:
                plan = fp16_range.plans[fp.buckets[m]]
                for p, form in fp.library.items():
                    st = plan.steps[p]
                    own = [list(plan.buffers[a].shape) if a >= 0 else None for a in st.args]
                    args, out = fp.unflatten(p, fp.shapes(p, [m])[0])
                    assert (args, out) == (own, list(plan.buffers[st.out].shape)), (m, p)
                    if form.kind == "widest":
                        wide_args, wide_out = fp.widest(p, members)
                        for mine, wide in zip([out] + args, [wide_out] + wide_args):
                            assert mine is None or all(a <= b for a, b in zip(mine, wide)), (p, mine, wide)
                    if form.kind == "variant":
                        rows, which = fp.variants(p, members)
                        assert fp.unflatten(p, rows[which[int(np.searchsorted(members, m))]]) == (args, out)
            origin = fp.origin(members)
            assert fp.blocks[origin] == fp.blocks[members].max()
        io = fp.io()
        for m in (0, len(fp.family.sizes) - 1):
            plan = fp16_range.plans[fp.family.buckets[m]]
            for side in ("inputs", "outputs"):
                assert [(n, bufs[m]) for n, bufs in io[side]] == [(n, plan.buffers[b]) for n, b in getattr(plan, side)]
    assert docs is fp16_range.plans.docs


def test_a_family_whose_attributes_differ_between_sizes_says_why():
    """fp32 keeps attention as GEMMs over strided views of the length: their attributes are sizes."""
    reasons = [fp.reason for fp in _plans(_range("fp32"))]
    assert reasons and all(r and "attributes that differ between sizes" in r for r in reasons), reasons


def test_a_bound_output_of_a_family_size_is_checked_without_joining_its_plan(fp16_range):
    """IOBinding checks a bound output against the run's output shape: for a size stored as formulas it comes
    from them (joining a plan costs milliseconds a request over a range of 10^4 sizes)."""
    import grapec
    docs = fp16_range.plans.docs
    sess = grapec.load(fp16_range, backend="cpu")
    family = docs.families[-1]
    bucket = family.buckets[len(family.buckets) // 2]
    assert bucket not in docs.base
    shapes = sess._output_shapes(bucket)
    assert bucket not in docs.base   # not joined
    plan = fp16_range.plans[bucket]
    assert shapes == {n: tuple(plan.buffers[b].shape) for n, b in plan.outputs}


def test_output_shapes_of_family_sizes_parse_the_template_once_a_family(fp16_range, monkeypatch):
    """A bound run asks for its size's output shapes; over a range each request is mostly a new size. The family's
    I/O rows are taken out of its plan template once (Family.io_rows): parsing the whole template for each size
    cost 8 ms a request on full Wav2Vec2 and woke the collector. Every size still gets its own shapes."""
    import grapec
    from grapec.bundle import families as fam
    calls = []
    real = fam.numbered_template
    monkeypatch.setattr(fam, "numbered_template", lambda key: calls.append(key) or real(key))
    docs = fp16_range.plans.docs
    sess = grapec.load(fp16_range, backend="cpu")
    family = docs.families[-1]
    family._io = None
    members = list(family.buckets[:: max(1, len(family.buckets) // 6)])
    shapes = [sess._output_shapes(b) for b in members]
    assert len(calls) == 1, len(calls)
    for b, got in zip(members, shapes):
        plan = fp16_range.plans[b]
        assert got == {n: tuple(plan.buffers[i].shape) for n, i in plan.outputs}
    assert len({tuple(map(tuple, g.values())) for g in shapes}) > 1   # (frames: two lengths may give one count)


def test_the_compile_says_how_the_range_runs_on_the_gpu(fp16_range, monkeypatch):
    """The compile reports which sizes run from their family's formulas on the GPU and which join a plan each."""
    import re
    from grapec.runtime.cuda.family_plan import FAMILY_EXEC_MIN
    line = next(m for m in SAID["fp16"] if m.startswith("range on the GPU"))
    ran, joined = map(int, re.search(r"(\d+) sizes in families.*; (\d+) sizes join", line).groups())
    assert ran + joined == len(fp16_range.plans)
    assert ran == sum(len(f.all_buckets) for f in fp16_range.plans.docs.families if len(f.buckets) >= FAMILY_EXEC_MIN)


def test_stored_sizes_that_the_formulas_give_run_with_the_family(fp16_range):
    """A structure's compiled sizes and spot members are stored as plans; where its formulas give their plans
    and CUDA rows number for number (checked at compile time) the GPU runs them as members, so a range needs a
    plan and a graph of its own only for the sizes no family gives."""
    docs = fp16_range.plans.docs
    assert any(f.also for f in docs.families)
    stored = set(docs.stored_buckets)
    sized = set(fp16_range.manifest["cuda"]["sized"])
    for f in docs.families:
        assert set(f.also) <= stored and not set(f.also) & set(f.buckets)
        fp = plan_family(f, sized)
        io = fp.io()
        for i in range(len(f.buckets), len(fp.buckets)):   # the also-buckets, after the members
            bucket = fp.buckets[i]
            assert fp16_range.manifest["buckets"][bucket]["shapes"]["input_values"] == [1, int(fp.sizes[i][0])]
            plan = fp16_range.plans[bucket]
            for p in fp.library:
                st = plan.steps[p]
                assert fp.unflatten(p, fp.shapes(p, [i])[0]) == (
                    [list(plan.buffers[a].shape) if a >= 0 else None for a in st.args], list(plan.buffers[st.out].shape))
            for side in ("inputs", "outputs"):
                assert [(n, bufs[i]) for n, bufs in io[side]] == [(n, plan.buffers[b]) for n, b in getattr(plan, side)]


def test_inspect_says_how_the_range_runs_on_the_gpu(fp16_range, tmp_path, monkeypatch):
    """`grapec inspect` reports the same as the compile: which sizes run from their families' formulas."""
    from click.testing import CliRunner
    from grapec.tools.cli import main
    path = tmp_path / "w2v.grape"
    fp16_range.write(str(path))
    monkeypatch.setenv("GRAPEC_FAMILY_EXECS", "all")
    out = CliRunner().invoke(main, ["inspect", str(path)])
    assert out.exit_code == 0, out.output
    total = len(fp16_range.plans)
    given = sum(len(f.all_buckets) for f in fp16_range.plans.docs.families)
    assert f"range on the GPU: {given} sizes in families of at least 2 run from their formulas" in out.output
    assert f"{total - given} sizes join a plan each at load" in out.output


def test_a_2d_range_runs_its_gemms_over_all_rows_at_the_widest():
    """Over batch x seq, a GEMM's operands differ in their leading dims too (GPT-2's LM head: [batch, seq, 768]
    against a [vocab, 768] weight): one GEMM over the flattened rows at the band's most rows serves every size,
    no shape variant per size."""
    gpt2 = os.path.join(ROOT, "models", "tiny", "gpt2.onnx")
    b = Bundle.from_bytes(compile_model(gpt2, dynamic={"batch": (1, 2), "seq": (1, 64)}, targets=["sm_90"], jobs=2,
                                        precision="fp16").to_bytes())
    sized = set(b.manifest["cuda"]["sized"])
    over_rows = 0
    for f in b.plans.docs.families:
        fp = plan_family(f, sized)
        if fp.reason is not None:
            continue
        for p, form in fp.library.items():
            if not form.rows:
                continue
            over_rows += 1
            for band in sorted(set(fp.bands.tolist())):
                members = fp.members(band)
                args, out = fp.widest(p, members)
                for m in (int(members[0]), int(members[-1])):
                    plan = b.plans[fp.buckets[m]]
                    st = plan.steps[p]
                    mine = [plan.buffers[st.out].shape, plan.buffers[st.args[0]].shape]
                    for shape, wide in zip(mine, [out, args[0]]):
                        assert wide[-1] == shape[-1] and wide[-2] >= int(np.prod(shape[:-1])), (p, shape, wide)
                        assert all(d == 1 for d in wide[:-2])
                    assert args[1] == list(plan.buffers[st.args[1]].shape)   # the weight as it is
    assert over_rows


def test_a_kernel_without_a_sized_twin_runs_as_it_is_where_its_launch_never_changes(fp16_range):
    """A function merged across no sizes has no sized twin: the family still runs from its formulas where that
    kernel's launch (grid, block, arguments) is the same at every size, and says why not where it is not."""
    from grapec.bundle.families import numbered_template
    from grapec.runtime.cuda.family_plan import _ints
    from grapec.runtime.cuda.size_record import family_kernels
    sized = set(fp16_range.manifest["cuda"]["sized"])
    fixed = moving = 0
    for f in fp16_range.plans.docs.families:
        rows = numbered_template(f.cuda.template)
        for p, k in family_kernels(f).items():
            function = rows[k][0]
            same = all(f.cuda.fit.constant(j) is not None for j in _ints(rows[k][1]) + _ints(rows[k][2]))
            fp = plan_family(f, sized - {function})
            if same:
                fixed += 1
                assert fp.reason is None and p not in fp.sized, fp.reason
            else:
                moving += 1
                assert fp.reason and "launches otherwise at some sizes" in fp.reason, fp.reason
    assert moving   # (no kernel of these families keeps one launch; full BERT 1..512 has one: not a test of its size)


def test_the_report_follows_grapec_family_execs(fp16_range, monkeypatch):
    """GRAPEC_FAMILY_EXECS=0 keeps every size on its own plan, and a number sets the least members a family needs."""
    from grapec.runtime.cuda.family_plan import range_on_gpu
    families, sized, n = fp16_range.plans.docs.families, set(fp16_range.manifest["cuda"]["sized"]), len(fp16_range.plans)
    monkeypatch.setenv("GRAPEC_FAMILY_EXECS", "0")
    assert range_on_gpu(families, sized, n).text() == f"range on the GPU: GRAPEC_FAMILY_EXECS=0: all {n} sizes join a plan each at load"
    biggest = max(len(f.buckets) for f in families)
    monkeypatch.setenv("GRAPEC_FAMILY_EXECS", str(biggest))
    got = range_on_gpu(families, sized, n)
    assert got.least == biggest and got.from_formulas == sum(len(f.all_buckets) for f in families if len(f.buckets) == biggest)
    assert got.execs >= 1


@pytest.mark.parametrize("ratio", ["1.5", "1.25", "1.1"])
def test_a_familys_bands_are_the_fewest_within_the_ratio(ratio, monkeypatch):
    """shared_exec.even_bands: a family's blocks cut into the fewest bands whose largest is within the ratio of
    their smallest; the grid of powers of the ratio (bands_of) takes as many or more for the same span."""
    from grapec.runtime.cuda.shared_exec import bands_of, even_bands
    monkeypatch.setenv("GRAPEC_BAND_RATIO", ratio)
    r = float(ratio)
    for lo, hi in ((1000, 1001), (1000, 1400), (347, 35021), (5, 5)):
        blocks = np.arange(lo, hi + 1)   # every count between: a family's sizes launch blocks densely
        bands = even_bands(blocks)
        want = max(1, int(np.ceil(np.log(hi / lo) / np.log(r) - 1e-9)))
        assert sorted(set(bands.tolist())) == list(range(want)), (lo, hi)
        assert np.all(np.diff(bands) >= 0)   # in order of blocks
        for band in range(want):
            inside = blocks[bands == band]
            assert inside.max() <= r * inside.min() + 1e-9, (lo, hi, band)
        assert want <= len(set(bands_of(blocks).tolist()))
