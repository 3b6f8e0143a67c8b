# Does the generation loop's body get what programmatic dependent launch gives the decode step alone? The full
# Llama-1B-shaped builder export (fp16), batch 1: the decode step alone (past 384, one launch: grapec bench) and the
# generation loop (ms/token), each with GRAPEC_DEPENDENT_LAUNCH on and off; then every step of one decode step.
# Carry .whl. Usage: bash next-llm-pdl.sh [llama1b|llama1b-2l]
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl
M=${1:-llama1b}; ONNX=/tmp/llm/${M}_fp16/model.onnx
[ -f $ONNX ] || timeout 240 python3 models/llm.py $M --out /tmp/llm --precision fp16 \
    --builder-dir /tmp/site/onnxruntime_genai/models > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
python3 -m grapec.tools.cli compile $ONNX -o /tmp/step.grape \
    --dim batch_size=1,sequence_length=1,past_sequence_length=384,total_sequence_length=384,kv_cache_dim=64 \
    > $OUT/step-compile.log 2>&1; echo "step compiled rc $? ($(left) s left)"
for DL in 1 0; do
    GRAPEC_DEPENDENT_LAUNCH=$DL python3 -m grapec.tools.cli bench /tmp/step.grape --iterations 300 > $OUT/step-dl$DL.log 2>&1
    echo "step dl=$DL rc $? ($(left) s left)"
    GRAPEC_DEPENDENT_LAUNCH=$DL timeout 150 python3 benchmarks/llm.py --model $ONNX --batch 1 --prompt 128 --new 256 \
        --prefill 0 --peers none --iterations 3 > $OUT/loop-dl$DL.log 2>&1; echo "loop dl=$DL rc $? ($(left) s left)"
done
timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model $ONNX --steps --prompt 128 --new 256 --prefill 128 \
    --json $OUT/steps.json > $OUT/steps.log 2>&1; echo "steps rc $? ($(left) s left)"
for DL in 1 0; do echo "== dependent launch $DL"; grep -iE "replay|median" $OUT/step-dl$DL.log | head -3; grep "ms/token" $OUT/loop-dl$DL.log | tail -1; done
