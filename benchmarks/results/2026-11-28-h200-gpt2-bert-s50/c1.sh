# call 1: GPT-2's and BERT's seq 1..512 range bundles and 8 single-length bundles each compiled (background,
# one after the other), while the GPU tests of the dynamic path run (an edited test among them)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
( for m in gpt2 bert; do
    python3 benchmarks/traffic.py --model $m --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
        --compile-only > $OUT/$m-compile.log 2>&1; echo "$m compile rc $?" >> $OUT/$m-compile.log
  done ) &
timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_dynamic.py tests/test_gpu_family_exec.py \
    tests/test_small_gemm.py -rA > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc $?" >> $OUT/gpu-tests.log
wait
grep -E "^(FAILED|ERROR)|passed|failed|rc " $OUT/gpu-tests.log | tail -n 8
for m in gpt2 bert; do grep -E "launch structures|rc " $OUT/$m-compile.log | cut -c1-300; done; ls out/bench/traffic-bundles | wc -l
