# call 5: run_parts.py on tiny Wav2Vec2 (bundles compiled on the CPU machine, carried in out/s54), then the GPU tests again
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 240 python3 benchmarks/results/2026-11-29-h200-s54/run_parts.py models/tiny/wav2vec2.onnx out/s54/w2v-tiny-range.grape \
    'out/s54/w2v-tiny-{n}.grape' 1600,24229,46857 > $OUT/run-parts-tiny.log 2>&1; echo "parts rc $?"
[ "$1" = tests ] && timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/test_gpu_family_exec.py tests/test_gpu_dynamic.py \
    tests/test_sdpa.py tests/test_attention.py tests/test_mappings.py tests/test_family_plan.py > $OUT/gpu-tests.log 2>&1
echo "tests rc $?"; tail -n 3 $OUT/gpu-tests.log; tail -n 12 $OUT/run-parts-tiny.log
