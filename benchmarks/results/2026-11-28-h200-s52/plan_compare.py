# session 52, on the 2-core CPU machine: a range bundle's plan at one length against a single-length compile of it,
# steps by kind and the cost model's estimate (h200 profile). usage: python plan_compare.py RANGE.grape SAMPLES
# the range bundle's plan at a length against a single-length compile of it: steps by kind and origin
import sys, time, collections
sys.path.insert(0, "src")
import grapec
from grapec.bundle.format import Bundle
from grapec.cost.report import plan_report, top_level_us
from grapec.cost.device import load_profile
n = int(sys.argv[2])
prof = load_profile("h200")
rb = Bundle.read(sys.argv[1])
i = n - 1600
rp = rb.plans[i]
print("range bucket shapes", rb.manifest["buckets"][i]["shapes"] if isinstance(rb.manifest["buckets"][i], dict) else None)
t = time.time()
sb = grapec.compile("/tmp/full/wav2vec2.onnx", dims={"batch": 1, "samples": n}, precision="fp16")
print("single compiled", round(time.time() - t, 1))
sp = sb.plans[0]
for name, b, p in (("range", rb, rp), ("single", sb, sp)):
    rows = plan_report(b.kernels, p, prof, alternatives=False)
    kinds = collections.Counter(r["kind"] for r in rows if isinstance(r["step"], int))
    print(name, len(p.steps), "steps", dict(kinds), "est us", round(top_level_us(rows), 1))
    print("  first:", [(st.op, (getattr(st, "origin", None) or [""])[:2]) for st in p.steps[:8]])
