# The packed small GEMM (branch wip/int4-small-gemm: MatMulNBits' 4-bit codes at 2-16 rows unpacked inside a
# small GEMM) against main, in one call. Before it: on the branch, `rm -rf .ab && mkdir .ab && git archive main src
# | tar -x -C .ab`; carry .ab and the wheels setup.sh and the builder need (nvmath, cudnn frontend, onnx_ir,
# onnxscript, ml_dtypes, onnxruntime_genai). First the GPU tests it touches (a failure: stop and read them),
# then the Llama-1B-shaped int4 builder export's generation loop at batch 1, 4 and 16 on each side.
# Usage: bash next-int4-small-gemm.sh
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl 2>/dev/null
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_packed_small_gemm.py \
    tests/test_matmul_nbits.py tests/test_genai_models.py > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $? ($(left) s left)"
tail -n 2 $OUT/gpu-tests.log; grep -E "^FAILED" $OUT/gpu-tests.log | cut -c1-200 | head -8
ONNX=/tmp/llm/llama1b_int4/model.onnx
[ -f $ONNX ] || timeout 200 python3 models/llm.py llama1b --out /tmp/llm --precision int4 \
    --builder-dir /tmp/site/onnxruntime_genai/models > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
. benchmarks/results/2026-11-29-h200-s59/ab-root.sh
for side in new main; do
    use_side $side
    timeout $(( ($(left) - 10) / 2 )) python3 $ROOTDIR/benchmarks/llm.py --model $ONNX --batch 1 4 16 --prompt 128 \
        --new 256 --prefill 0 --peers none --iterations 3 > $OUT/loop-$side.log 2>&1; echo "$side loop rc $? ($(left) s left)"
done
for side in new main; do echo "== $side"; grep -E "^\| (1|4|16) " $OUT/loop-$side.log; done
