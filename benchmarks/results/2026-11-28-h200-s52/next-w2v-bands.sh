# prepared for the next session (not run in session 52), two calls back to back on a warm machine:
#   bash next-w2v-bands.sh compile   (the ONNX file, the range and the 8 single-length bundles, ~8 minutes on 16 cores)
#   bash next-w2v-bands.sh traffic   (grapec at bands of 1.5, 1.25 and 1.1, the ideal with its bound row, 300 requests)
# Wav2Vec2's range was 1.33x its ideal in session 52, its bound row 1.35x: a band's sizes run its widest shapes.
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
W="--model wav2vec2 --size full --range 1600:160000 --precision fp16 --ideal-lengths 8 --requests 300"
if [ "$1" = compile ]; then
  python3 models/build.py --size full --out models/full wav2vec2 > $OUT/w2v-build.log 2>&1; echo "build rc $?"
  ( timeout 540 python3 benchmarks/traffic.py $W --compile-only --no-ideal > $OUT/w2v-range-compile.log 2>&1; echo "range rc $?" ) &
  ( timeout 540 python3 benchmarks/traffic.py $W --singles-only > $OUT/w2v-singles.log 2>&1; echo "singles rc $?" ) &
  wait; ls -l out/bench/traffic-bundles/
else
  timeout 580 python3 benchmarks/traffic.py $W --peers "" --band-ratios 1.25,1.1 --out $OUT/w2v-bands > $OUT/w2v-bands.log 2>&1
  echo "bands rc $?"; grep -v "graphs built" $OUT/w2v-bands.log | tail -n 30
fi
