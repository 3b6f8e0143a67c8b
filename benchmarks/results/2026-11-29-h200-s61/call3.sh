# Session 61, call 3 (branch wip/int4-small-gemm, the codes unpacked in MatMulNBits' own order): the packed small
# GEMM's GPU tests, the Llama-1B-shaped int4 builder export's loop at batch 1, 4 and 16, then its decode step's
# kernels alone at batch 4 and 16 (benchmarks/llm.py --steps --step-batch).
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl 2>/dev/null
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_packed_small_gemm.py \
    tests/test_matmul_nbits.py > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $? ($(left) s left)"
tail -n 1 $OUT/gpu-tests.log; grep -E "^FAILED" $OUT/gpu-tests.log | cut -c1-200 | head -8
ONNX=/tmp/llm/llama1b_int4/model.onnx
[ -f $ONNX ] || timeout 200 python3 models/llm.py llama1b --out /tmp/llm --precision int4 \
    --builder-dir /tmp/site/onnxruntime_genai/models > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
timeout 200 python3 benchmarks/llm.py --model $ONNX --batch 1 4 16 --prompt 128 --new 256 --prefill 0 --peers none \
    --iterations 3 > $OUT/loop.log 2>&1; echo "loop rc $? ($(left) s left)"; grep -E "weights|^\| (1|4|16) " $OUT/loop.log | tail -4
for rows in 4 16; do
    timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model $ONNX --steps --step-batch $rows --prompt 128 --new 256 \
        --prefill 0 --json $OUT/steps-$rows.json > $OUT/steps-$rows.log 2>&1; echo "steps $rows rc $? ($(left) s left)"
    grep -A12 "decode step" $OUT/steps-$rows.log | cut -c1-150
done
