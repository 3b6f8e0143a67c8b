# Llama-shaped decode before and after session 56's plan changes (the norm as the QKV projection's small-GEMM
# prologue, the output projection a small GEMM at one query instead of cuBLASLt), on one GPU in one call: the
# session's start code (ad18f91) from .ab/src (made by `git archive ad18f91 src | tar -x -C .ab`) against the
# tree's src. Carry .whl (onnx_ir, onnxscript, ml_dtypes, onnxruntime_genai for its builder folder) and .ab.
# Usage: bash next-llm-ab.sh [llama1b-2l|llama1b]
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl
M=${1:-llama1b-2l}
timeout 200 python3 models/llm.py $M --out /tmp/llm --precision fp16 --builder-dir /tmp/site/onnxruntime_genai/models \
    > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
for side in before after; do
  P=src; [ $side = before ] && P=.ab/src
  [ $side = before ] && T=$(( ($(left) - 10) / 3 ))
  [ $side = after ] && T=$(( ($(left) - 10) / 2 ))
  PYTHONPATH=/tmp/site:$P:tests:models:benchmarks timeout $T python3 benchmarks/llm.py --model /tmp/llm/${M}_fp16/model.onnx \
      --batch 1 4 --prompt 128 --new 256 --prefill 0 --peers none --json $OUT/$side.json > $OUT/$side.log 2>&1
  echo "$side rc $? ($(left) s left)"
done
# each step of the prompt pass and of one decode step alone, and one launch of each graph (this code)
PYTHONPATH=/tmp/site:src:tests:models:benchmarks timeout $(( $(left) - 5 )) python3 benchmarks/llm.py \
    --model /tmp/llm/${M}_fp16/model.onnx --steps --prompt 128 --new 256 --prefill 1024 > $OUT/steps.log 2>&1
echo "steps rc $? ($(left) s left)"
for side in before after; do echo "== $side"; tail -n 8 $OUT/$side.log; done; grep "us alone" $OUT/steps.log
