# Session 60, second call: the GPU tests the fusion, upcast and head-dim-256 changes touch, then GPT-J-6B's
# checkpoint and optimum export (s59's next-gptj.sh build). Carry .whl/optimum and the nvmath and cudnn wheels.
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_attention.py tests/test_decoder_generation.py \
    tests/test_gpu.py > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $? ($(left) s left)"; tail -n 3 $OUT/gpu-tests.log
grep -E "^FAILED|Error" $OUT/gpu-tests.log | cut -c1-200 | head -8
bash benchmarks/results/2026-11-29-h200-s59/next-gptj.sh build
