# call D: the numpy gap (numpy_gap.py), then the GPU tests the first call did not reach
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 benchmarks/results/2026-11-27-h200-bert-traffic/numpy_gap.py > $OUT/numpy-gap.log 2> $OUT/numpy-gap.err
timeout ${TESTS_S:-380} python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_gpu_iobinding.py tests/test_gpu_predication.py \
  tests/test_gpu_real_callers.py tests/test_gpu_streams.py tests/test_grid_stitch.py tests/test_matmul_nbits.py \
  tests/test_sdpa.py tests/test_siblings.py tests/test_small_gemm.py tests/test_threads.py tests/test_gpu_full.py \
  tests/test_gpu_dynamic.py > $OUT/gpu-tests-2.log 2>&1; echo "rc $?" >> $OUT/gpu-tests-2.log
tail -4 $OUT/gpu-tests-2.log; head -8 $OUT/numpy-gap.log; tail -3 $OUT/numpy-gap.err
