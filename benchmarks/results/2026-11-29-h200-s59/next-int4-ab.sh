# The int4 decode step and loop, main before this session's GEMV changes (.ab/src: git archive db025fe src) against
# this tree, on the Llama-1B-shaped builder export in int4 (built here unless /tmp/llm has it), then every step of
# this tree's decode step. benchmarks/llm.py puts its own ROOT/src first on sys.path, so main's side runs from a
# root whose src is .ab/src. Carry .whl and .ab. Usage: bash next-int4-ab.sh
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl 2>/dev/null
ONNX=/tmp/llm/llama1b_int4/model.onnx
[ -f $ONNX ] || timeout 200 python3 models/llm.py llama1b --out /tmp/llm --precision int4 \
    --builder-dir /tmp/site/onnxruntime_genai/models > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
. benchmarks/results/2026-11-29-h200-s59/ab-root.sh
for side in main new; do
    use_side $side
    python3 -m grapec.tools.cli compile $ONNX -o /tmp/step-$side.grape --dim $DIMS > /tmp/step-$side-compile.log 2>&1
    python3 -m grapec.tools.cli bench /tmp/step-$side.grape --iterations 300 > $OUT/step-$side.log 2>&1
    echo "$side step rc $? ($(left) s left)"
    timeout 150 python3 $ROOTDIR/benchmarks/llm.py --model $ONNX --batch 1 4 --prompt 128 --new 256 --prefill 0 \
        --peers none --iterations 3 > $OUT/loop-$side.log 2>&1; echo "$side loop rc $? ($(left) s left)"
    grep -m1 "grapec" $OUT/loop-$side.log >/dev/null && python3 -c "import grapec, sys; print('$side grapec from', grapec.__file__)"
done
export PYTHONPATH=/tmp/site:src:tests:models:benchmarks
timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model $ONNX --steps --prompt 128 --new 256 --prefill 128 \
    --json $OUT/steps.json > $OUT/steps.log 2>&1; echo "steps rc $? ($(left) s left)"
for side in main new; do echo "== $side"; grep "1 graph launch" $OUT/step-$side.log; grep -E "^\| (1|4) " $OUT/loop-$side.log; done
grep -A10 "decode step" $OUT/steps.log | head -11
