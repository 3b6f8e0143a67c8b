import cProfile, pstats, sys, time
sys.path.insert(0, "src")
from grapec.compiler import compile_model
sizes = [{"batch": b, "seq": s} for b, s in [(64, 512), (37, 300), (9, 77), (2, 13)]]
pr = cProfile.Profile()
t0 = time.time()
pr.enable()
compile_model("/tmp/full/gpt2.onnx", bucket_dims=sizes, precision="fp16", targets=[], jobs=1,
              calibration_dims={"batch": 1, "seq": 64})
pr.disable()
print("total", time.time() - t0)
st = pstats.Stats(pr)
st.sort_stats("cumulative").print_stats(60)
