import sys, time, collections
sys.path.insert(0, "src")
import grapec
from grapec.compiler import structures as S
orig = S._fit
why = collections.Counter()
def fit(docs, sizes):
    r = orig(docs, sizes)
    if isinstance(r, str):
        why[r.split(" numbers")[0] if "follow" not in r else "follow-no-formula"] += 1
        if "follow" in r and why["follow-no-formula"] <= 3:
            import numpy as np
            from grapec.compiler.formulas import fit_numbers
            ints = np.array([docs[s].ints for s in sizes], np.int64)
            nf = fit_numbers(np.array(sizes), ints)
            bad = [j for j, x in enumerate(nf.slots) if x is None][:3]
            for j in bad:
                print("  slot", j, "n sizes", len(sizes), [(s, int(ints[i, j])) for i, s in enumerate(sizes)][:14])
    return r
S._fit = fit
B, Sq = int(sys.argv[1]), int(sys.argv[2])
import grapec.compiler.pipeline as P
class Stop(Exception): pass
o = P.compile_range
def w(*a, **k):
    r = o(*a, **k); print(r[1].summary()[:600]); raise Stop
P.compile_range = w
try: grapec.compile("/tmp/gpt2_512.onnx", dynamic={"batch": (1, B), "seq": (1, Sq)}, jobs=2, progress=lambda m: None, targets=[])
except Stop: pass
print(why)
