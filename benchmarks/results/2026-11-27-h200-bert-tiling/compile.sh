# call A: BERT's range and 8 single-length bundles compiled (background) while the GPU tests that the
# attention tiling touches run
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
( python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --compile-only > $OUT/bert-compile.log 2>&1; echo "compile rc $?" >> $OUT/bert-compile.log ) &
timeout ${TESTS_S:-420} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_dynamic.py tests/test_attention.py \
    tests/test_sdpa.py tests/test_codegen.py tests/test_range_structures.py > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc $?" >> $OUT/gpu-tests.log
wait
tail -5 $OUT/gpu-tests.log; grep -E "range|stored|families|compiled in" $OUT/bert-compile.log | tail -6; tail -2 $OUT/bert-compile.log
