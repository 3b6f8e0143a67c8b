# Session 62, call 4-5: GPT-J-6B-shaped fp16 (issue 35: Grape's model). `bash call4.sh build` (carry .whl/optimum and
# the nvmath and cudnn wheels: s59's next-gptj.sh build), then back to back while the machine is warm `bash call4.sh
# run`: this tree's generation at batch 1 (prompt 128, 256 new) against the weight-read limit, then its decode step.
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
[ "$1" = build ] && exec bash benchmarks/results/2026-11-29-h200-s59/next-gptj.sh build
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
ONNX=/tmp/llm/gptj6b_optimum_fp16/model.onnx
timeout $(( $(left) - 100 )) python3 benchmarks/llm.py --model $ONNX --batch 1 --prompt 128 --new 256 \
    --prefill 0 --peers none --iterations 3 > $OUT/gptj.log 2>&1; echo "run rc $? ($(left) s left)"
grep -E "^\| 1 |limit" $OUT/gptj.log | cut -c1-160
[ $(left) -gt 60 ] && timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model $ONNX --steps --prompt 128 \
    --new 256 --prefill 0 --json $OUT/steps.json > $OUT/steps.log 2>&1; echo "steps rc $? ($(left) s left)"
grep -A14 "decode step" $OUT/steps.log | cut -c1-150 | head -15
