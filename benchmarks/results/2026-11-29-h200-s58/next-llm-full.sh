# The full Llama-1B-shaped decoder (builder export, fp16) at this code, in one call: each step of one decode step
# alone and one launch of its graph (past 384), then the generation loop's ms/token at batch 1. Carry .whl.
# Usage: bash next-llm-full.sh [llama1b|llama1b-2l]
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl
M=${1:-llama1b}; ONNX=/tmp/llm/${M}_fp16/model.onnx
timeout 240 python3 models/llm.py $M --out /tmp/llm --precision fp16 --builder-dir /tmp/site/onnxruntime_genai/models \
    > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
timeout $(( ($(left) - 10) / 2 )) python3 benchmarks/llm.py --model $ONNX --steps --prompt 128 --new 256 --prefill 128 \
    > $OUT/steps.log 2>&1; echo "steps rc $? ($(left) s left)"
timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model $ONNX --batch 1 --prompt 128 --new 256 --prefill 0 \
    --peers none --iterations 3 --json $OUT/b1.json > $OUT/b1.log 2>&1; echo "b1 rc $? ($(left) s left)"
grep -A14 "decode step" $OUT/steps.log | cut -c1-160; tail -n 4 $OUT/b1.log
