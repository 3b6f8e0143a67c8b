# prepared for the next session (not run in session 53), two calls back to back on a warm machine:
#   bash next-w2v-steps.sh compile   (the ONNX file, the range and the 8 single-length bundles, ~8 minutes on 16 cores)
#   bash next-w2v-steps.sh steps     (range against single-length bundles at the ideal's 8 lengths; per step at 3)
# Full Wav2Vec2's range was 1.33x its ideal in session 52, its bound row 1.35x: the difference is GPU work. GPT-2's
# 1.16x was one step at one length (session 53: a mapping repeated for another op), found this way.
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
W="--model wav2vec2 --size full --range 1600:160000 --precision fp16 --ideal-lengths 8 --requests 300"
if [ "$1" = compile ]; then
  python3 models/build.py --size full --out models/full wav2vec2 > $OUT/w2v-build.log 2>&1; echo "build rc $?"
  ( timeout 540 python3 benchmarks/traffic.py $W --compile-only --no-ideal > $OUT/w2v-range-compile.log 2>&1; echo "range rc $?" ) &
  ( timeout 540 python3 benchmarks/traffic.py $W --singles-only > $OUT/w2v-singles.log 2>&1; echo "singles rc $?" ) &
  wait; ls -l out/bench/traffic-bundles/
else
  timeout 580 python3 benchmarks/results/2026-11-28-h200-bert-gap/steps.py wav2vec2 \
      1600,24229,46857,69486,92114,114743,137371,160000 24229,92114,160000 > $OUT/w2v-steps.log 2> $OUT/w2v-steps.err
  echo "steps rc $?"; tail -n 3 $OUT/w2v-steps.err; grep "^## length" $OUT/w2v-steps.log; tail -n 10 $OUT/w2v-steps.log
fi
