import sys, time, json
sys.path.insert(0, "src")
import grapec
from grapec.compiler import families as F
from grapec.bundle.families import cuda_rows, kernel_order
orig = F.fit_cuda_rows
shown = [0]
def dbg(family, entry, plan_of):
    r = orig(family, entry, plan_of)
    if isinstance(r, str) and shown[0] < 4:
        shown[0] += 1
        rows = {s: cuda_rows(entry, kernel_order(plan_of[s])) for s in family.evidence}
        s0 = family.evidence[0]
        for s in family.evidence[1:]:
            for i, (a, b) in enumerate(zip(rows[s0], rows[s])):
                if a[0] != b[0] or json.dumps(a[1]) .replace("0","").replace("1","") and False:
                    print("FAMILY", family.sizes[0], r, "sizes", s0, s, "row", i, "\n  ", a[0], json.dumps(a[1]), "\n  ", b[0], json.dumps(b[1]))
                    break
            else:
                continue
            break
    return r
F.fit_cuda_rows = dbg
import grapec.compiler.pipeline as P
rng = lambda a: tuple(int(x) for x in a.split(":")) if ":" in a else (1, int(a))
B, S = rng(sys.argv[1]), rng(sys.argv[2])
t = time.time()
b = grapec.compile("/tmp/gpt2_512.onnx", dynamic={"batch": B, "seq": S}, jobs=2, progress=lambda m: print(f"[{time.time()-t:6.1f}s] {m[:400]}", flush=True) if "sizes compiled" not in m else None)
