import sys, json
sys.path.insert(0, "/work/main/src")
import grapec.compiler.families as F
from grapec.bundle.families import cuda_rows, kernel_order
from grapec.bundle.templates import split
orig = F.fit_cuda_rows
def wrapped(family, entry, plan_of):
    r = orig(family, entry, plan_of)
    if isinstance(r, str):
        ev = family.evidence
        rows = {s: cuda_rows(entry, kernel_order(plan_of[s])) for s in ev}
        a = ev[0]
        for s in ev[1:]:
            ta, tb = split(rows[a]), split(rows[s])
            if json.dumps(ta[0]) != json.dumps(tb[0]) or ta[2] != tb[2]:
                for i, (x, y) in enumerate(zip(rows[a], rows[s])):
                    if json.dumps(split(x)[0]) != json.dumps(split(y)[0]) or split(x)[2] != split(y)[2]:
                        print("sizes", a, s, "kernel row", i); print("  ", str(x)[:400]); print("  ", str(y)[:400]); break
                break
    return r
F.fit_cuda_rows = wrapped
from grapec.compiler import compile_model
compile_model("/tmp/bert_512.onnx", dims={"batch": 1}, dynamic={"seq": (1, 512)}, precision="fp16", jobs=2)
