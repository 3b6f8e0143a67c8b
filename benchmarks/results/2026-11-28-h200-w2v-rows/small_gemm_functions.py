# session 49: small-GEMM functions and launch structures of tiny GPT-2 fp16 over seq 1..24 (run before and after the merge)
import sys, time, collections
sys.path.insert(0, "tests")
from grapec.compiler.pipeline import compile_model
from grapec.ir.kinds import kernel_from_json
from grapec.ir.small_gemm import SmallGemmKernel
t=time.time()
b = compile_model("models/tiny/gpt2.onnx", dims={"batch": 1}, dynamic={"seq": (1, 24)}, precision="fp16", targets=["sm_90"], jobs=2)
print("compile", time.time()-t)
cuda = b.manifest["cuda"]
names = cuda["kernels"]
sg = [i for i,k in enumerate(b.kernels) if k.get("kind")=="small_gemm"]
print("small gemm kernels", len(sg), "functions", len({names[i] for i in sg}))
print("structures", len({tuple(names[st.kernel] for st in p.steps if hasattr(st,'kernel')) for p in b.plans}))
fam = getattr(b.plans, "docs", None)
print("families", [len(f.sizes) for f in getattr(fam, "families", ())])
