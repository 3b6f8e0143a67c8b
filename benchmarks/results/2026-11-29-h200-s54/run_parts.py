"""Where a run of a range family's size spends the time its replay does not (session 54: full Wav2Vec2's
family sizes ran 0.25-0.53 ms over their exec's replay, the single-length bundles 0.05-0.22).
Per length, medians over K runs at that length, host clock, for the range bundle and the length's own bundle:
    run     sess.run, numpy in and out
    switch  the family's switch (dims written; nothing else at a repeated length)
    in      the inputs' copies issued
    launch  cuGraphLaunch's own host time
    wait    cuStreamSynchronize after the launch (GPU time not yet hidden by the host)
    alone   one launch between events after an idle stream (what a request's GPU part costs)
    replay  K launches back to back between events, per launch
    alone, uploaded   one launch alone again, after cuGraphUpload (a re-upload per launch would show here)
usage: run_parts.py ONNX RANGE_BUNDLE SINGLE_PATTERN L1,L2,..  (SINGLE_PATTERN holds {n})"""
import statistics, sys, time
import numpy as np
sys.path.insert(0, "benchmarks")
import grapec
from grapec.bundle.format import Bundle
from grapec.runtime.cuda.driver import call
from traffic import model_inputs, feeds_for

K = 100
onnx_path, range_path, pattern, lengths = sys.argv[1], sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4].split(",")]
inputs = model_inputs(onnx_path)
med = lambda xs: statistics.median(xs) * 1e3


def exec_of(runner, bucket):
    if runner.families is not None and runner.families.owns(bucket):
        return runner.families.switch(bucket).exec, True
    runner.prepare(bucket)
    return runner.program(bucket, runner.plan(bucket).steps)[0].exec, False


def parts(sess, feeds):
    r = sess._runner
    bucket = sess.select_bucket({k: v.shape for k, v in feeds.items()})
    for _ in range(5):
        sess.run(feeds)
    run = []
    for _ in range(K):
        t0 = time.perf_counter(); sess.run(feeds); run.append(time.perf_counter() - t0)
    exe, family = exec_of(r, bucket)
    if family:
        ins = r.families.buffers(bucket, "inputs")
        ptrs = [r.families.ptr(buf) for _, buf in ins]
    else:
        plan = r.plan(bucket)
        ins = [(name, plan.buffers[b]) for name, b in plan.inputs]
        ptrs = [r.ptr(bucket, b) for _, b in plan.inputs]
    sw, cin, lau, wait, alone = [], [], [], [], []
    a, b = call("cuEventCreate", 0), call("cuEventCreate", 0)
    for _ in range(K):
        r._pending = []
        t0 = time.perf_counter()
        if family:
            r.families.switch(bucket)
        t1 = time.perf_counter()
        for (name, buf), p in zip(ins, ptrs):
            r.copy_array_in(p, buf.nbytes, feeds[name])
        t2 = time.perf_counter()
        call("cuEventRecord", a, r.stream)
        call("cuGraphLaunch", exe, r.stream)
        call("cuEventRecord", b, r.stream)
        t3 = time.perf_counter()
        call("cuStreamSynchronize", r.stream)
        t4 = time.perf_counter()
        sw.append(t1 - t0); cin.append(t2 - t1); lau.append(t3 - t2); wait.append(t4 - t3)
        alone.append(float(call("cuEventElapsedTime", a, b)) / 1e3)
    call("cuEventRecord", a, r.stream)
    for _ in range(K):
        call("cuGraphLaunch", exe, r.stream)
    call("cuEventRecord", b, r.stream); call("cuEventSynchronize", b)
    replay = float(call("cuEventElapsedTime", a, b)) / 1e3 / K
    # the exec uploaded first: an exec the driver re-uploads at each launch (after node updates) runs faster so
    call("cuGraphUpload", exe, r.stream); call("cuStreamSynchronize", r.stream)
    uploaded = []
    for _ in range(K):
        call("cuEventRecord", a, r.stream)
        call("cuGraphLaunch", exe, r.stream)
        call("cuEventRecord", b, r.stream); call("cuEventSynchronize", b)
        uploaded.append(float(call("cuEventElapsedTime", a, b)) / 1e3)
    return [med(run), med(sw), med(cin), med(lau), med(wait), med(alone), replay * 1e3, med(uploaded)]


rs = grapec.load(Bundle.read(range_path), backend="cuda")
# no build_graphs(): a tiny range builds thousands of small plans at load; a family builds its band exec at first use
rng = np.random.default_rng(0)
rows = []
for n in lengths:
    feeds = feeds_for(n, inputs, rng)
    ss = grapec.load(Bundle.read(pattern.format(n=n)), backend="cuda")
    rows.append((n, "single", parts(ss, feeds)))
    rows.append((n, "range", parts(rs, feeds)))
    print(n, rows[-2][2], rows[-1][2], flush=True)
    ss.close()
print("| length | bundle | run | switch | in | launch | wait | alone | replay | alone, uploaded |\n|---|---|---|---|---|---|---|---|---|---|")
for n, which, p in rows:
    print(f"| {n} | {which} | " + " | ".join(f"{x:.3f}" for x in p) + " |")
