"""cProfile of a range family's switch at a repeated length (session 55: 0.05-0.135 ms a run on full Wav2Vec2)."""
import cProfile, pstats, sys
import numpy as np
sys.path.insert(0, "benchmarks")
import grapec
from grapec.bundle.format import Bundle
from traffic import model_inputs, feeds_for
onnx_path, range_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rs = grapec.load(Bundle.read(range_path), backend="cuda")
feeds = feeds_for(n, model_inputs(onnx_path), np.random.default_rng(0))
for _ in range(5):
    rs.run(feeds)
r = rs._runner
bucket = rs.select_bucket({k: v.shape for k, v in feeds.items()})
pr = cProfile.Profile(); pr.enable()
for _ in range(200):
    r.families.switch(bucket)
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
pr = cProfile.Profile(); pr.enable()
for _ in range(200):
    rs.run(feeds)
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
