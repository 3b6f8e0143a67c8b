# session 46, CPU: full GPT-2 fp16 over batch 1:64 x seq 1:512 (session 45's bundle): with families of at least 256
# run from their formulas, the per-size constants of its batch>=2 families (a weight at another offset at each size)
# come from the formulas as the joined plans place them
# usage: PYTHONPATH=src python constants-check.py /tmp/gpt2_2d_z.grape
import os, sys
import numpy as np
sys.path.insert(0, "src")
os.environ["GRAPEC_FAMILY_EXECS"] = "256"
from grapec.bundle.format import Bundle
from grapec.runtime.cuda.family_plan import plan_family, range_on_gpu
b = Bundle.read(sys.argv[1])
sized = set(b.manifest["cuda"]["sized"])
fams = b.plans.docs.families
print(range_on_gpu(fams, sized, len(b.plans)).text())
rng = np.random.default_rng(0)
for f in fams:
    if len(f.buckets) < 256:
        continue
    fp = plan_family(f, sized)
    if fp.reason or not fp.constants:
        continue
    picks = sorted({0, len(f.buckets) - 1} | {int(x) for x in rng.integers(0, len(f.buckets), 6)})
    for name in fp.constants:
        offs, nbytes = fp.places(name, picks)
        for m, off, nb in zip(picks, offs, nbytes):
            plan = b.plans[f.buckets[m]]
            buf = next(x for x in plan.buffers if x.name == name)
            assert (buf.space, buf.offset, buf.nbytes) == ("weight", int(off), int(nb)), (name, m)
    print(f"family of {len(f.buckets)} from {f.sizes[0].tolist()}: per-size constants {sorted(fp.constants)} placed as "
          f"the joined plans place them at {len(picks)} members")
