# call 3: the GPU tests touched since session 53's last GPU run
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/test_gpu_family_exec.py tests/test_gpu_dynamic.py \
    tests/test_sdpa.py tests/test_attention.py tests/test_mappings.py tests/test_family_plan.py > $OUT/gpu-tests.log 2>&1
echo "tests rc $?"; tail -n 5 $OUT/gpu-tests.log
