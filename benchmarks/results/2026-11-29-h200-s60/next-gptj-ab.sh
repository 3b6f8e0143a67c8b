# GPT-J-6B-shaped fp16 (issue 35: Grape's model), this tree against another (.ab/src) in one run, then this tree's
# step profile. Before the calls: `rm -rf .ab && mkdir .ab && git archive <ref> src | tar -x -C .ab` (9236f9a:
# main before session 60's fusion and upcast changes). Call `bash next-gptj-ab.sh build` (carry .whl/optimum and
# the nvmath and cudnn wheels), then back to back while the machine is warm `bash next-gptj-ab.sh run` (carry .ab).
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
ONNX=/tmp/llm/gptj6b_optimum_fp16/model.onnx
if [ "$1" = build ]; then
    exec bash benchmarks/results/2026-11-29-h200-s59/next-gptj.sh build
fi
. benchmarks/results/2026-11-29-h200-s59/ab-root.sh
for side in new main; do
    use_side $side
    timeout $(( $(left) - 5 )) python3 $ROOTDIR/benchmarks/llm.py --model $ONNX --batch 1 --prompt 128 --new 256 \
        --prefill 0 --peers none --iterations 3 > $OUT/gptj-$side.log 2>&1; echo "$side rc $? ($(left) s left)"
    grep -E "^\| 1 " $OUT/gptj-$side.log | cut -c1-120
done
use_side new
[ $(left) -gt 120 ] && timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model $ONNX --steps --prompt 128 \
    --new 256 --prefill 128 --json $OUT/steps.json > $OUT/steps.log 2>&1; echo "steps rc $? ($(left) s left)"
grep -A14 "decode step" $OUT/steps.log | head -15
