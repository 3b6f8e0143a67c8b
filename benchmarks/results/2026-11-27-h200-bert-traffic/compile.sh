# call A: BERT's range and 8 single-length bundles compiled (background) while the GPU tests run
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
( python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --compile-only > $OUT/bert-compile.log 2>&1; echo "compile rc $?" >> $OUT/bert-compile.log ) &
timeout ${TESTS_S:-480} python3 -m pytest -q -m gpu -p no:cacheprovider tests > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc $?" >> $OUT/gpu-tests.log
wait
tail -5 $OUT/gpu-tests.log; tail -4 $OUT/bert-compile.log; ls -la out/bench/traffic-bundles
