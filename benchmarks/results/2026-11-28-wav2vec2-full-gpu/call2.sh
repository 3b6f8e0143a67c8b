# call 2: the shipped bundle checked and cached for traffic.py; the single-length bundles compiled in the background;
# 16 sampled lengths against onnxruntime; the 2-D family-exec GPU test (its switch count fixed)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
D=benchmarks/results/2026-11-28-wav2vec2-full-gpu
echo "bundle sha256 $(sha256sum /tmp/ship/w2v.grape | cut -c1-16) (want $(cat $D/bundle.sha256 | cut -c1-16))"
cp /tmp/ship/w2v.grape out/bench/traffic-bundles/wav2vec2-fp16-samples1600-160000.grape
[ -f models/full/wav2vec2.onnx ] || python3 models/build.py --size full --out models/full wav2vec2 > $OUT/build.log 2>&1
( timeout 400 python3 benchmarks/traffic.py --model wav2vec2 --size full --range 1600:160000 --precision fp16 \
    --ideal-lengths 8 --requests 2000 --compile-only > $OUT/singles-compile.log 2>&1; echo "singles rc $?" >> $OUT/singles-compile.log ) &
echo "onnx sha256 $(sha256sum models/full/wav2vec2.onnx | cut -c1-16) (the bundle's: $(cat $D/onnx.sha256 | cut -c1-16))"
timeout 300 python3 $D/check16.py out/bench/traffic-bundles/wav2vec2-fp16-samples1600-160000.grape models/full/wav2vec2.onnx cuda > $OUT/check16.log 2>&1
echo "check16 rc $?"; tail -n 17 $OUT/check16.log
wait
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_family_exec.py -k 2d > $OUT/family-tests.log 2>&1
echo "2-D family test rc $?"; grep -E "passed|failed|Error" $OUT/family-tests.log | tail -n 6
tail -n 3 $OUT/singles-compile.log; ls out/bench/traffic-bundles/
