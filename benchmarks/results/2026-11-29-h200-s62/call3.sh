# Session 62, call 3 (on wip/half-walk; carry .ab = `git archive 4e39266 src` in .ab/main0, and the nvmath, cudnn
# frontend, onnx_ir, onnxscript, ml_dtypes and onnxruntime_genai wheels). The GPU tests of the small GEMMs (the fp16
# staged split is merged), then the Llama-1B-shaped builder export's loop, int4 and fp16, at batch 1, 4 and 16:
# this tree (a prologue left out where the one-tile grid would walk: packed weights on main 727dc7f, half weights on
# the branch) against main before it (4e39266), then this tree's decode step alone at 4 rows.
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl 2>/dev/null
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_small_gemm.py tests/test_packed_small_gemm.py \
    > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $? ($(left) s left)"
tail -n 1 $OUT/gpu-tests.log; grep -E "^FAILED" $OUT/gpu-tests.log | cut -c1-200 | head -8
rm -rf /tmp/root-main0 && mkdir /tmp/root-main0 && ln -s $PWD/.ab/main0/src /tmp/root-main0/src
for d in benchmarks models tests; do ln -s $PWD/$d /tmp/root-main0/$d; done
for precision in int4 fp16; do
    ONNX=/tmp/llm/llama1b_$precision/model.onnx
    [ -f $ONNX ] || timeout 150 python3 models/llm.py llama1b --out /tmp/llm --precision $precision \
        --builder-dir /tmp/site/onnxruntime_genai/models >> $OUT/build.log 2>&1
    for side in new main0; do
        root=$PWD; [ $side != new ] && root=/tmp/root-$side
        PYTHONPATH=/tmp/site:$root/src:tests:models:benchmarks timeout 110 python3 $root/benchmarks/llm.py --model $ONNX \
            --batch 1 4 16 --prompt 128 --new 256 --prefill 0 --peers none --iterations 3 > $OUT/$precision-$side.log 2>&1
        echo "$precision $side rc $? ($(left) s left)"
    done
done
for f in $OUT/*-new.log $OUT/*-main0.log; do echo "== $(basename $f)"; grep -E "^\| (1|4|16) " $f | cut -c1-40; done
for precision in int4 fp16; do
    [ $(left) -gt 40 ] && timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model /tmp/llm/llama1b_$precision/model.onnx \
        --steps --step-batch 4 --prompt 128 --new 256 --prefill 0 > $OUT/steps-$precision.log 2>&1
    echo "steps $precision rc $? ($(left) s left)"; grep -A3 "decode step" $OUT/steps-$precision.log | cut -c1-140
done
