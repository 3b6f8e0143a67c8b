# session 46, CPU: how full Wav2Vec2 1600:160000 (session 45 bundle, read and written again) runs from its formulas,
# and each family's size program against the joined plan's record at one member
# usage: PYTHONPATH=src python host-check.py /tmp/w2v_full_z.grape
import sys, time
sys.path.insert(0, "src")
from grapec.bundle.format import Bundle
from grapec.runtime.cuda.family_plan import plan_family, range_on_gpu
from grapec.codegen.size_program import run_size_program
import numpy as np
b = Bundle.read(sys.argv[1])
sized = set(b.manifest["cuda"]["sized"])
t = time.time()
print(range_on_gpu(b.plans.docs.families, sized, len(b.plans)).text(), f"{time.time()-t:.1f}s")
for f in b.plans.docs.families:
    fp = plan_family(f, sized)
    prog = fp.record_program()
    print(len(f.sizes), "extra vars", len(f.plan.fit.extra), len(f.cuda.fit.extra), "prog", len(prog), "outputs", prog[2])
    # the record of a random member from the program equals the joined plan's scalars + grids
    m = len(f.sizes) // 3
    rec = run_size_program(prog, f.sizes[m])
    plan = b.plans[f.buckets[m]]
    cuda = b.manifest["cuda"]
    want = []
    for p in fp.sized:
        k = plan.steps[p].kernel
        want += [int(v) if t == "i64" else int(np.float64(v).view(np.int64)) for t, v in cuda["scalars"][k]] + [int(cuda["launch"][k][1])]
    assert rec.tolist() == want, (len(rec), len(want))
print("records ok")
