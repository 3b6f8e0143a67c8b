# session 48: why the band of 87725 samples (sibling nodes) is wrong: its variant steps' nodes, which are enabled,
# and the same lengths after alternatives (the held variant set again with its node enabled first; no node disabled)
import sys, time
import numpy as np, onnxruntime as ort, grapec
from grapec.bundle.format import Bundle
from grapec.runtime.cuda.driver import call
b = Bundle.read(sys.argv[1]); sess = grapec.load(b, backend="cuda"); fam = sess._runner.families
ref = ort.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
rng = np.random.default_rng(48)
feeds = {n: {"input_values": rng.standard_normal((1, n)).astype(np.float32)} for n in (87725, 69919, 120981, 17022)}
want = {n: ref.run(None, f)[0] for n, f in feeds.items()}

def rel(n):
    got = sess.run(feeds[n])["last_hidden_state"].astype(np.float32)
    return float(np.linalg.norm(got - want[n]) / np.linalg.norm(want[n]))

def band(n):
    k, m = fam.owner[sess.select_bucket({"input_values": (1, n)})]
    return fam._exec(k, int(fam.plans[k].bands[m])), k, m

for n in feeds:
    print(f"{n}: rel {rel(n):.2e}", flush=True)
for n in (87725, 120981):
    ex, k, m = band(n)
    rel(n)
    for p, vs in ex.params.items():
        nodes = ex.siblings[p]
        st = b.plans[ex.origin].steps[p]
        print(f"{n}: band origin {ex.origin} step {p} ({st.attrs.get('op')}, {','.join(st.origin)}): {len(vs)} variants, "
              f"{len(ex.siblings[p])} nodes, holds {ex.current[p]} (node {[id(x) for x in nodes].index(id(vs[ex.current[p]].node))}), "
              f"enabled {[call('cuGraphNodeGetEnabled', ex.exec, x) for x in nodes]}, "
              f"variants per node {[sum(v.node is x for v in vs) for x in nodes]}", flush=True)
ex, k, m = band(87725)
rel(87725)
print("alternative 1: each held variant set again after its node is enabled", flush=True)
for p, vs in ex.params.items():
    v = vs[ex.current[p]]
    call("cuGraphNodeSetEnabled", ex.exec, v.node, 1)
    call(v.setter, ex.exec, v.node, v.params)
print(f"87725 rel {rel(87725):.2e}", flush=True)
print("alternative 2: every node of the step enabled (the held variant's node last set)", flush=True)
for p, vs in ex.params.items():
    for x in {id(v.node): v.node for v in vs}.values():
        call("cuGraphNodeSetEnabled", ex.exec, x, 1)
print(f"87725 rel {rel(87725):.2e}", flush=True)
