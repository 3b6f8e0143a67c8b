# call 7 (after the five parts): the shipped bundle checked and cached for traffic.py; the single-length bundles
# compiled in the background; 16 sampled lengths against onnxruntime on the GPU
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
D=benchmarks/results/2026-11-28-wav2vec2-siblings
echo "bundle sha256 $(sha256sum /tmp/ship/w2v.grape | cut -c1-16) (want $(cut -c1-16 $D/bundle.sha256))"
cp /tmp/ship/w2v.grape out/bench/traffic-bundles/wav2vec2-fp16-samples1600-160000.grape
( timeout 420 python3 benchmarks/traffic.py --model wav2vec2 --size full --range 1600:160000 --precision fp16 \
    --ideal-lengths 8 --requests 2000 --compile-only > $OUT/singles-compile.log 2>&1; echo "singles rc $?" >> $OUT/singles-compile.log ) &
timeout 400 python3 benchmarks/results/2026-11-28-wav2vec2-full-gpu/check16.py out/bench/traffic-bundles/wav2vec2-fp16-samples1600-160000.grape models/full/wav2vec2.onnx cuda \
    > $OUT/check16.log 2>&1
echo "check16 rc $?"; tail -n 18 $OUT/check16.log
wait; tail -n 3 $OUT/singles-compile.log; ls out/bench/traffic-bundles/
