"""Why a range bundle of full GPT-2 fp16 seq 1..512 has more execs than templates, and which nodes a switch patches."""
import collections, statistics, sys, time
import numpy as np
import grapec
from traffic import model_path, compile_range, feeds_for
from grapec.plan import KernelStep, LibraryStep
lo, hi = 1, int(sys.argv[1]) if len(sys.argv) > 1 else 512
t0 = time.time()
b = compile_range(model_path("gpt2", "full"), lo, hi, "fp16", "out/bench/traffic-bundles", lambda m: None)
print(f"bundle ready {time.time()-t0:.0f}s", flush=True)
sess = grapec.load(b, backend="cuda")
r = sess._runner; sh = r.shared
rec = []
class Rec(dict):
    def setdefault(self, k, d=None):
        rec.append(k); return super().setdefault(k, d)
sh._key_ids = Rec()
full_of = {}
orig_key = sh.key
def key(bucket, seg):
    n = len(rec); k = orig_key(bucket, seg)
    if len(rec) > n: full_of[bucket] = rec[-1]
    return k
sh.key = key
t1 = time.time(); sess.build_graphs(); print(f"build_graphs {time.time()-t1:.0f}s", flush=True)
rng = np.random.default_rng(4)
for n in range(lo, hi + 1):
    sess.run(feeds_for(n, 50257, rng))
docs = b.plans.docs
tmpl = {bk: docs.where[bk][0] for bk in range(len(b.plans))}
print("templates", len(set(tmpl.values())), "keys", len(set(sh.key_of.values())), "structures", len(sh.structures))
by_t = collections.defaultdict(set)
for bk, k in sh.key_of.items(): by_t[tmpl[bk]].add(k)
def op(plan, p):
    st = plan.steps[p]
    return f"{p}:{st.op}" + (f"/{st.attrs.get('op')}" if isinstance(st, LibraryStep) else "")
for t, ks in sorted(by_t.items()):
    members = sorted(bk for bk in sh.key_of if tmpl[bk] == t)
    print(f"template {t}: sizes {members[0]+1}..{members[-1]+1} ({len(members)}), keys {len(ks)}")
    if len(ks) > 1:
        firsts = {}
        for bk in members: firsts.setdefault(sh.key_of[bk], bk)
        a, *rest = list(firsts.values())
        fa = full_of[a]; plan = r.plan(a)
        for c in rest[:3]:
            fc = full_of[c]
            what = []
            if fa[0][0] != fc[0][0]: what.append("template")
            if fa[0][1] != fc[0][1]: what.append("graph shape")
            if fa[0][2] != fc[0][2]:
                kp = [i for i, (x, y) in enumerate(zip(fa[0][2], fc[0][2])) if x != y]
                what.append(f"kernel fns at kernel steps {kp[:6]} {[ (fa[0][2][i], fc[0][2][i]) for i in kp[:2]]}")
            if fa[1] != fc[1]:
                what.append(f"node types at {[op(plan, p) for p, (x, y) in enumerate(zip(fa[1], fc[1])) if x != y][:8]}")
            if fa[2] != fc[2]:
                what.append(f"clusters {[(i, x, y) for i, (x, y) in enumerate(zip(fa[2], fc[2])) if x != y][:8]}")
            print(f"   size {a+1} vs {c+1}: {'; '.join(what)}")
for k, s in sh.structures.items():
    plan = r.plan(s.origin)
    print(f"exec {k}: {len(s.members)} members from size {min(s.members)+1}, varying {len(s.varying)}: {[op(plan, p) for p in sorted(s.varying)][:30]}")
seq = [int(x) for x in np.random.default_rng(0).integers(lo, hi + 1, 1000)]
feeds = {n: feeds_for(n, 50257, rng) for n in set(seq)}
sh.reset_switch_time() if hasattr(sh, "reset_switch_time") else None
for n in seq: sess.run(feeds[n], on_device=True)
print("switch_us", r.switch_us, "switches", dict(r.switches))
