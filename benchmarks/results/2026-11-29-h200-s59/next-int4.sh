# The int4 GEMV change (codegen/vectors.py: 16 bytes of codes a lane a step, codes to float by their bits, the block
# scale once a step) on the GPU, in one call: its GPU tests, then the Llama-1B-shaped builder export in int4 (the
# builder's -p int4: MatMulNBits, block 32): the decode step alone (past 384) and the loop at batch 1 and 4, each
# with main's code before the change (.ab/src) and this tree's, then every step of this tree's decode step.
# Carry .whl and .ab. Usage: bash next-int4.sh
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 tests/test_matmul_nbits.py tests/test_genai_models.py \
    > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $? ($(left) s left)"; tail -n 3 $OUT/gpu-tests.log
ONNX=/tmp/llm/llama1b_int4/model.onnx
timeout 200 python3 models/llm.py llama1b --out /tmp/llm --precision int4 --builder-dir /tmp/site/onnxruntime_genai/models \
    > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
DIMS=batch_size=1,sequence_length=1,past_sequence_length=384,total_sequence_length=384,kv_cache_dim=64
for side in main new; do
    P=src; [ $side = main ] && P=.ab/src
    export PYTHONPATH=/tmp/site:$P:tests:models:benchmarks
    python3 -m grapec.tools.cli compile $ONNX -o /tmp/step-$side.grape --dim $DIMS > $OUT/step-$side-compile.log 2>&1
    python3 -m grapec.tools.cli bench /tmp/step-$side.grape --iterations 300 > $OUT/step-$side.log 2>&1
    echo "$side step rc $? ($(left) s left)"
    timeout 150 python3 benchmarks/llm.py --model $ONNX --batch 1 4 --prompt 128 --new 256 --prefill 0 --peers none \
        --iterations 3 > $OUT/loop-$side.log 2>&1; echo "$side loop rc $? ($(left) s left)"
done
export PYTHONPATH=/tmp/site:src:tests:models:benchmarks
timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model $ONNX --steps --prompt 128 --new 256 --prefill 128 \
    --json $OUT/steps.json > $OUT/steps.log 2>&1; echo "steps rc $? ($(left) s left)"
for side in main new; do echo "== $side"; grep "1 graph launch" $OUT/step-$side.log; grep -E "^\| (1|4) " $OUT/loop-$side.log; done
grep -A12 "decode step" $OUT/steps.log | head -14
