"""GPT-2 full fp16, batch 1, one length: cuDNN's SDPA against grapec's generated attention kernel, per run
(200 runs on device buffers, medians of 5 rounds, same process) and the device memory each session took
after build_graphs. Which a range bundle should run at 321..511."""
import statistics, sys, time
import numpy as np
import grapec
from traffic import model_path, feeds_for
from grapec.runtime.cuda import driver as D

MIB = 2 ** 20
dev = D.Device(0)
path = model_path("gpt2", "full")
rows = []
for seq in [int(x) for x in sys.argv[1:]] or [384, 448, 511]:
    feeds = feeds_for(seq, 50257, np.random.default_rng(seq))
    res = {}
    for engine in ("cudnn", "kernel"):
        b = grapec.compile(path, dims={"batch": 1, "seq": seq}, precision="fp16", attention=engine)
        f0 = dev.mem_info()[0]
        sess = grapec.load(b, backend="cuda"); sess.build_graphs()
        out = sess.run(feeds)["logits"]
        mem = (f0 - dev.mem_info()[0]) / MIB
        for _ in range(20):
            sess.run(feeds, on_device=True)
        dev.synchronize()
        rounds = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(200):
                sess.run(feeds, on_device=True)
            dev.synchronize()
            rounds.append((time.perf_counter() - t) / 200 * 1e3)
        res[engine] = (statistics.median(rounds), mem, out)
        sess.close()
    d = float(np.abs(res["cudnn"][2].astype(np.float32) - res["kernel"][2].astype(np.float32)).max())
    rows.append((seq, res["cudnn"][0], res["kernel"][0], res["cudnn"][1], res["kernel"][1], d))
    print(rows[-1], flush=True)
print("| seq | cuDNN ms | kernel ms | kernel / cuDNN | cuDNN MiB | kernel MiB | max abs diff |")
for seq, a, k, ma, mk, d in rows:
    print(f"| {seq} | {a:.3f} | {k:.3f} | {k / a:.2f} | {ma:.0f} | {mk:.0f} | {d:.3g} |")
