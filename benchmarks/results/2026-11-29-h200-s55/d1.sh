# call: the full Wav2Vec2 range and its 8 single-length bundles compiled (next-w2v-bands.sh compile), and while the
# range compiles, once the singles are done, the GPU tests of the family execs, the loader kernel and codegen
# fp16 calibrated at 32000 samples (--calibrate-at): at 160000 the numpy interpreter took 117 s on this 2-core
# machine, and call 7 spent 221 s of its 408 outside the range's own 187; every node stays fp16 either way
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
W="--calibrate-at 32000 --model wav2vec2 --size full --range 1600:160000 --precision fp16 --ideal-lengths 8 --requests 300"
python3 models/build.py --size full --out models/full wav2vec2 > $OUT/w2v-build.log 2>&1; echo "build rc $?"
( timeout 540 python3 benchmarks/traffic.py $W --compile-only --no-ideal > $OUT/w2v-range-compile.log 2>&1; echo "range rc $?" ) &
( timeout 300 python3 benchmarks/traffic.py $W --singles-only > $OUT/w2v-singles.log 2>&1; echo "singles rc $?"
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -n 3 tests/test_gpu_family_exec.py tests/test_size_program.py tests/test_codegen.py > $OUT/gpu-tests.log 2>&1
  echo "tests rc $?"; tail -n 3 $OUT/gpu-tests.log ) &
wait; ls out/bench/traffic-bundles/
