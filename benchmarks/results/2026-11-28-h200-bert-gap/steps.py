"""Where BERT's range loses to its single-length bundles (H100 run of session 45 below: 1.21x in length
medians, the 97..320 structure worst): per top-level step, the GPU time of the range bundle's step at a
length (its shared exec's launch: sized twin, widest GEMM) against the single-length bundle's, then the
whole replay of each between CUDA events, numpy and bound times.
usage: steps.py [MODEL] L1,L2,.. [P1,P2,..]  (MODEL bert by default; session 52 added it for GPT-2's range; session
53 the lengths P profiled per step, all by default, each length's numpy time when the lengths alternate, and
wav2vec2 over its samples 1600..160000)"""
import statistics, sys, time
import numpy as np
sys.path.insert(0, "benchmarks")
import grapec
from grapec.plan import KernelStep, LibraryStep
from grapec.runtime.cuda.profile import profile_steps
from grapec.runtime.cuda.driver import call
from traffic import compile_range, compile_singles, model_inputs, model_path, feeds_for, sync

MODEL, LENGTHS = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("bert", sys.argv[1] if len(sys.argv) > 1 else "147,293,400")
path = model_path(MODEL, "full")
cache = "out/bench/traffic-bundles"
say = lambda m: print(m, file=sys.stderr, flush=True)
lengths = [int(x) for x in LENGTHS.split(",")]
profiled = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else lengths
dim, lo, hi = ("samples", 1600, 160000) if MODEL == "wav2vec2" else ("seq", 1, 512)   # traffic.py's ranges
singles = compile_singles(path, dim, lengths, "fp16", cache)
ranged = compile_range(path, dim, lo, hi, "fp16", cache, say)
inputs = model_inputs(path)
rng = np.random.default_rng(0)
feeds = {n: feeds_for(n, inputs, rng) for n in lengths}

def med(fn, k=60):
    for _ in range(5): fn()
    ts = []
    for _ in range(k):
        t0 = time.perf_counter(); fn(); sync("cuda"); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3

def replay_ms(runner, bucket, k=50):
    """One bucket's exec replayed k times between events (inputs already in the arena)."""
    if runner.families is not None and runner.families.owns(bucket):   # a range family's band exec, its dims set
        exe = runner.families.switch(bucket).exec
    else:
        exe = runner.program(bucket, runner.plan(bucket).steps)[0].exec
    a, b = call("cuEventCreate", 0), call("cuEventCreate", 0)
    for _ in range(5): call("cuGraphLaunch", exe, runner.stream)
    call("cuEventRecord", a, runner.stream)
    for _ in range(k): call("cuGraphLaunch", exe, runner.stream)
    call("cuEventRecord", b, runner.stream); call("cuEventSynchronize", b)
    return float(call("cuEventElapsedTime", a, b)) / k

def describe(runner, bucket, st):
    if isinstance(st, KernelStep):
        name = runner.bundle.manifest["cuda"]["kernels"][st.kernel]
        sized = runner.sized_launch(bucket, st)
        grid = runner.bundle.manifest["cuda"]["launch"][st.kernel][1]
        return f"{name[:38]} grid {grid}{' sized' if sized is not None else ''}"
    if isinstance(st, LibraryStep):
        wide = runner.widest_gemm(bucket, st)
        shp = [tuple(runner.plan(bucket).buffers[a].shape) for a in [st.out] + list(st.args) if a >= 0]
        return f"{st.attrs.get('op')} {shp[:3]}{' widest ' + str(wide[1]) if wide else ''}"
    return type(st).__name__

def bound_run(sess, f):
    b = sess.io_binding()
    for k, v in f.items(): b.bind_input(k, v)
    for o in sess.get_outputs(): b.bind_output(o.name)
    sess.run_with_iobinding(b)

rs = grapec.load(ranged, backend="cuda"); rs.build_graphs()
summary = []
for n in lengths:
    ss = grapec.load(singles[n], backend="cuda")
    rows = [n, med(lambda: ss.run(feeds[n])), med(lambda: rs.run(feeds[n])),
            med(lambda: bound_run(ss, feeds[n])), med(lambda: bound_run(rs, feeds[n]))]
    rr, sr = rs._runner, ss._runner
    rb = rs.select_bucket({k: v.shape for k, v in feeds[n].items()}); sb = 0
    rs.run(feeds[n]); ss.run(feeds[n])
    rows += [replay_ms(sr, sb), replay_ms(rr, rb)]
    summary.append(rows)
    if n not in profiled:
        ss.close()
        continue
    if rr.families is not None and rr.families.owns(rb):
        # profile_steps builds a step at the size's own shapes, not its band exec's: the band's facts instead, and
        # the single bundle's steps (where the time goes)
        fam, m = rr.families.owner[rb]
        fp = rr.families.plans[fam]
        members = fp.members(int(fp.bands[m]))
        print(f"\n## length {n}: family {fam} member {m}, band of {len(members)} sizes "
              f"{fp.sizes[members].min()}..{fp.sizes[members].max()}, blocks {fp.blocks[m]} of the band's "
              f"{fp.blocks[members].max()}")
        for p, form in sorted(fp.library.items()):
            own = fp.unflatten(p, fp.shapes(p, [m])[0])
            ran = fp.widest(p, members) if form.kind == "widest" else own
            print(f"library step {p} {form.kind}: own {own[1]} <- {own[0]}; runs {ran[1]}")
        sp = profile_steps(sr, sb)
        print("### single")
        for i, t in enumerate(sp):
            print(f"{i} {t.us:.1f} {describe(sr, sb, sr.plan(sb).steps[i])}")
        ss.close()
        continue
    rp, sp = profile_steps(rr, rb), profile_steps(sr, sb)
    rplan, splan = rr.plan(rb), sr.plan(sb)
    print(f"\n## length {n}: single {len(splan.steps)} steps, sum {sum(t.us for t in sp):.1f} us; "
          f"range {len(rplan.steps)} steps, sum {sum(t.us for t in rp):.1f} us")
    if len(rp) == len(sp):
        diffs = sorted(range(len(rp)), key=lambda i: -(rp[i].us - sp[i].us))
        print("| step | single us | range us | single | range |\n|---|---|---|---|---|")
        for i in diffs[:25]:
            print(f"| {i} | {sp[i].us:.1f} | {rp[i].us:.1f} | {describe(sr, sb, splan.steps[i])} | {describe(rr, rb, rplan.steps[i])} |")
    else:
        for name, r, plan, prof in (("single", sr, splan, sp), ("range", rr, rplan, rp)):
            print(f"### {name}")
            for i, t in enumerate(prof):
                print(f"{i} {t.us:.1f} {describe(r, sb if name == 'single' else rb, plan.steps[i])}")
    ss.close()
# the range in traffic: each request's length another than the last (a switch each time), numpy in and out
order = list(np.random.default_rng(1).choice(lengths, 40 * len(lengths)))
alternating = {n: [] for n in lengths}
for n in order[:10]: rs.run(feeds[n])
for n in order:
    t0 = time.perf_counter(); rs.run(feeds[n]); sync("cuda"); alternating[n].append(time.perf_counter() - t0)
for r in summary: r.append(statistics.median(alternating[r[0]]) * 1e3)
print("\n| length | single numpy | range numpy | single bound | range bound | single replay | range replay | range numpy, random order |\n|---|---|---|---|---|---|---|---|")
for r in summary: print("| %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |" % tuple(r))
