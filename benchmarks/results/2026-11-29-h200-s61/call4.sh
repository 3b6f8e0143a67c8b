# Session 61, call 4 (branch wip/int4-small-gemm): packed weights in the split form where A is read as it lies.
# Its GPU tests; the Llama-1B-shaped int4 builder export's loop at batch 1, 4 and 16 for three codes in one run:
# this tree (new), .ab/onetile/src (af739c4: the packed one-tile form) and .ab/main/src (main); then this tree's
# decode step alone at batch 4 and 16.
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl 2>/dev/null
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_packed_small_gemm.py \
    tests/test_matmul_nbits.py tests/test_genai_models.py > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $? ($(left) s left)"
tail -n 1 $OUT/gpu-tests.log; grep -E "^FAILED" $OUT/gpu-tests.log | cut -c1-200 | head -8
ONNX=/tmp/llm/llama1b_int4/model.onnx
[ -f $ONNX ] || timeout 200 python3 models/llm.py llama1b --out /tmp/llm --precision int4 \
    --builder-dir /tmp/site/onnxruntime_genai/models > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
for side in onetile main; do
    rm -rf /tmp/root-$side && mkdir /tmp/root-$side && ln -s $PWD/.ab/$side/src /tmp/root-$side/src
    for d in benchmarks models tests; do ln -s $PWD/$d /tmp/root-$side/$d; done
done
for side in new onetile main; do
    root=$PWD; [ $side != new ] && root=/tmp/root-$side
    PYTHONPATH=/tmp/site:$root/src:tests:models:benchmarks timeout 120 python3 $root/benchmarks/llm.py --model $ONNX \
        --batch 1 4 16 --prompt 128 --new 256 --prefill 0 --peers none --iterations 3 > $OUT/loop-$side.log 2>&1
    echo "$side loop rc $? ($(left) s left)"
done
for side in new onetile main; do echo "== $side"; grep -E "weights .* GiB;|^\| (1|4|16) " $OUT/loop-$side.log | cut -c1-150; done
for rows in 4 16; do
    timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model $ONNX --steps --step-batch $rows --prompt 128 --new 256 \
        --prefill 0 --json $OUT/steps-$rows.json > $OUT/steps-$rows.log 2>&1; echo "steps $rows rc $? ($(left) s left)"
    grep -A8 "decode step" $OUT/steps-$rows.log | cut -c1-150
done
