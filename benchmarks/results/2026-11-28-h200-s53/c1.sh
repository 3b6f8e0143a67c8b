# session 53, call 1: GPU tests of the paths session 52 touched (causal mask made from the shapes, sdpa engines,
# dynamic shapes, host arrays), then GPT-2's per-step profile: range shared exec against single-length bundles
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sdpa.py tests/test_attention.py \
    tests/test_gpu_dynamic.py tests/test_host_arrays.py > $OUT/gpu-tests.log 2>&1; echo "tests rc $?"
timeout 330 python3 benchmarks/results/2026-11-28-h200-bert-gap/steps.py gpt2 74,220,439 > $OUT/steps.log 2> $OUT/steps.err
echo "steps rc $?"; tail -n 3 $OUT/steps.err; grep -E "^FAILED|passed|failed" $OUT/gpu-tests.log | tail -n 8
grep -A 30 "^## length 439" $OUT/steps.log | head -n 32; tail -n 6 $OUT/steps.log
