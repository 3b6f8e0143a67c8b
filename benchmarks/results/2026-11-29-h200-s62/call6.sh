# Session 62, call 6 (main after the fp16 staged split merge and the packed rule; carry the nvmath, cudnn frontend,
# onnx_ir, onnxscript, ml_dtypes and onnxruntime_genai wheels): the Llama-1B-shaped builder export in fp16, its
# three-bucket generation bundle (batch 16, 4 and 1) against the gpt-fast-style torch.compile static-cache loop on
# the same weights, in one process (issue 35: batch 16 tokens/s >= torch.compile's).
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl 2>/dev/null
timeout 100 python3 models/llm.py llama1b --out /tmp/llm --precision fp16 \
    --builder-dir /tmp/site/onnxruntime_genai/models > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
timeout 330 python3 benchmarks/llm.py --model /tmp/llm/llama1b_fp16/model.onnx --hf /tmp/llm/llama1b_hf --batch 16 4 1 \
    --prompt 128 --new 256 --prefill 0 --peers compile --iterations 3 --json $OUT/compile.json > $OUT/compile.log 2>&1
echo "run rc $? ($(left) s left)"
grep -E "ms/token|^\| (1|4|16) " $OUT/compile.log | cut -c1-200
