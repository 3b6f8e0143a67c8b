# call 1: GPT-2's seq 1..512 range and its 8 single-length bundles compiled in the background, while the GPU
# tests of this session's changes run (attention tilings taken from a larger size, copies fitted from their
# index, the dynamic and family paths they feed)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
( python3 benchmarks/traffic.py --model gpt2 --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --compile-only > $OUT/gpt2-compile.log 2>&1; echo "gpt2 compile rc $?" >> $OUT/gpt2-compile.log ) &
timeout 480 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py tests/test_strided_operands.py \
    tests/test_gpu_dynamic.py tests/test_gpu_family_exec.py tests/test_sdpa.py -rA > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc $?" >> $OUT/gpu-tests.log
wait
grep -E "^(FAILED|ERROR)|passed|failed|rc " $OUT/gpu-tests.log | tail -n 12
grep -E "launch structures|in all|rc " $OUT/gpt2-compile.log | cut -c1-300; ls out/bench/traffic-bundles | wc -l
