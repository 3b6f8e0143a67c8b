# Every GPU test but the full-size ones (tests/test_gpu_full.py, its own call), at this code, 8 workers.
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout ${BUDGET:-380} python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 -rs --ignore=tests/test_gpu_full.py tests \
    > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $?"; tail -n 8 $OUT/gpu-tests.log
