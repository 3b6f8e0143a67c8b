# Session 61, call 1: the GPU tests of session 60's main changes (README "Next" 0), the int4 small-GEMM branch's
# GPU tests (.ab = `git archive wip/int4-small-gemm src tests pyproject.toml`), then tests/test_gpu_full.py.
START=$(date +%s); left() { echo $(( 590 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 230 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 -rs tests/test_attention.py tests/test_decoder_generation.py \
    tests/test_gemv.py tests/test_gpu.py > $OUT/gpu-main.log 2>&1; echo "main gpu tests rc $? ($(left) s left)"
tail -n 1 $OUT/gpu-main.log; grep -E "^FAILED" $OUT/gpu-main.log | cut -c1-200 | head -8
(cd .ab && PYTHONPATH=/tmp/site:src:tests timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 \
    tests/test_packed_small_gemm.py tests/test_matmul_nbits.py > $OUT/gpu-int4-branch.log 2>&1); echo "branch rc $? ($(left) s left)"
tail -n 1 $OUT/gpu-int4-branch.log; grep -E "^FAILED" $OUT/gpu-int4-branch.log | cut -c1-200 | head -8
python3 models/build.py --size full --out models/full gpt2 bert resnet50 > $OUT/build-full.log 2>&1
timeout $(( $(left) - 5 )) python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 tests/test_gpu_full.py > $OUT/gpu-full.log 2>&1
echo "full rc $? ($(left) s left)"; tail -n 1 $OUT/gpu-full.log; grep -E "^FAILED" $OUT/gpu-full.log | cut -c1-200 | head -8
