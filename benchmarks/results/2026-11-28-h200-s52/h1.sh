# call 1 (carries the wheels): full Wav2Vec2's ONNX file, then its range bundle (1600..160000 samples, fp16) and the
# 8 single-length bundles of the ideal, compiled on the machine in two processes; meanwhile the GPU tests of the
# session's runtime change (outputs copied into page-locked blocks) and of the paths that read outputs back
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
mkdir -p $OUT/logs
W="--model wav2vec2 --size full --range 1600:160000 --precision fp16 --ideal-lengths 8 --requests 1000"
python3 models/build.py --size full --out models/full wav2vec2 > $OUT/logs/w2v-build.log 2>&1; echo "build rc $?"
( /usr/bin/time -v timeout 520 python3 benchmarks/traffic.py $W --compile-only --no-ideal > $OUT/logs/w2v-range-compile.log 2>&1
  echo "range compile rc $?" >> $OUT/logs/w2v-range-compile.log ) &
( timeout 520 python3 benchmarks/traffic.py $W --singles-only > $OUT/logs/w2v-singles-compile.log 2>&1
  echo "singles rc $?" >> $OUT/logs/w2v-singles-compile.log ) &
timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider -n 2 tests/test_host_arrays.py tests/test_gpu_iobinding.py \
    tests/test_gpu_dynamic.py tests/test_gpu_family_exec.py -rA > $OUT/logs/gpu-tests.log 2>&1
echo "gpu tests rc $?"; grep -E "^(FAILED|ERROR)|^E  .*Error|passed|failed" $OUT/logs/gpu-tests.log | tail -n 12
wait
grep -E "range:|CUDA code|in all|wrote|rc |Elapsed|Maximum resident" $OUT/logs/w2v-range-compile.log | grep -v "sizes compiled (" | tail -n 12
tail -n 2 $OUT/logs/w2v-singles-compile.log; ls -l out/bench/traffic-bundles/ models/full/
