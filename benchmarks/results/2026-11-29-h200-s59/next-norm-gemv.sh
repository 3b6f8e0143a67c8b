# The norm stitched into a memory-bound GEMV (branch wip/norm-into-gemv; or norm-into-gemv.patch here applied to
# main with `git apply`), A/B against main in one call. Before the call: `rm -rf .ab && mkdir .ab && git archive
# main src | tar -x -C .ab`; carry .whl and .ab. The GPU tests the change touches; the Llama-1B-shaped fp16 decode
# step alone (past 384) and its loop at batch 1, main against the change (main's side from a root whose src is
# .ab/src: benchmarks/llm.py puts its own ROOT/src first); GPT-2 (full size) at seq 1 in fp16 and fp32, whose
# LayerNorms before its GEMVs the change also stitches. Usage: bash next-norm-gemv.sh
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl 2>/dev/null
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_gemv.py tests/test_decoder_generation.py \
    tests/test_genai_models.py tests/test_gpu.py > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $? ($(left) s left)"
tail -n 2 $OUT/gpu-tests.log
ONNX=/tmp/llm/llama1b_fp16/model.onnx
[ -f $ONNX ] || timeout 200 python3 models/llm.py llama1b --out /tmp/llm --precision fp16 \
    --builder-dir /tmp/site/onnxruntime_genai/models > /tmp/build.log 2>&1; echo "build rc $? ($(left) s left)"
[ -f models/full/gpt2.onnx ] || python3 models/build.py --size full gpt2 > /tmp/gpt2-build.log 2>&1
. benchmarks/results/2026-11-29-h200-s59/ab-root.sh
for side in main wip; do
    use_side $side
    python3 -m grapec.tools.cli compile $ONNX -o /tmp/step-$side.grape --dim $DIMS > /dev/null 2>&1
    python3 -m grapec.tools.cli bench /tmp/step-$side.grape --iterations 300 > $OUT/step-$side.log 2>&1
    for p in fp16 fp32; do
        python3 -m grapec.tools.cli compile models/full/gpt2.onnx -o /tmp/gpt2-$p-$side.grape --dim batch=1,seq=1 \
            --precision $p > /dev/null 2>&1
        python3 -m grapec.tools.cli bench /tmp/gpt2-$p-$side.grape --iterations 300 > /tmp/gpt2-$p-$side.log 2>&1
        echo "gpt2 $p $side: $(grep '1 graph launch' /tmp/gpt2-$p-$side.log)" >> $OUT/gpt2.log
    done
    timeout 150 python3 $ROOTDIR/benchmarks/llm.py --model $ONNX --batch 1 --prompt 128 --new 256 --prefill 0 \
        --peers none --iterations 3 > $OUT/loop-$side.log 2>&1; echo "$side rc $? ($(left) s left)"
done
for side in main wip; do echo "== $side"; grep "1 graph launch" $OUT/step-$side.log; grep -E "^\| 1 " $OUT/loop-$side.log; done
cat $OUT/gpt2.log
