# call 1: the GPU tests of session 46's untested changes, while full Wav2Vec2 over 0.1-10 s compiles beside them
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
D=benchmarks/results/2026-11-28-wav2vec2-full-gpu
( timeout 560 python3 benchmarks/traffic.py --model wav2vec2 --size full --range 1600:160000 --precision fp16 \
    --ideal-lengths 8 --requests 2000 --compile-only > $OUT/w2v-compile.log 2>&1; echo "w2v compile rc $?" >> $OUT/w2v-compile.log ) &
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_family_exec.py > $OUT/family-tests.log 2>&1
echo "family tests rc $?"; grep -E "passed|failed|Error" $OUT/family-tests.log | tail -8
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_dynamic.py tests/test_gpu_iobinding.py tests/test_shared_exec_plan.py > $OUT/dynamic-tests.log 2>&1
echo "dynamic tests rc $?"; tail -n 3 $OUT/dynamic-tests.log
wait
tail -n 12 $OUT/w2v-compile.log; ls -la out/bench/traffic-bundles/ | tail -n 12
