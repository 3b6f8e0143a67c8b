# prepared for the next session (not run in session 53), two calls back to back on a warm machine:
#   bash benchmarks/results/2026-11-28-h200-s52/next-w2v-bands.sh compile   (the ONNX file, the range and the 8
#       single-length bundles, ~8 minutes on 16 cores)
#   bash benchmarks/results/2026-11-28-h200-s53/next-w2v-steps.sh   (range against single-length bundles at the
#       ideal's 8 lengths: numpy, bound, replay; each family size's band and the single bundle's steps at 3)
# Full Wav2Vec2's range was 1.33x its ideal in session 52, its bound row 1.35x: the difference is GPU work. GPT-2's
# 1.16x was one step at one length (session 53: a mapping repeated for another op), found this way.
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 580 python3 benchmarks/results/2026-11-28-h200-bert-gap/steps.py wav2vec2 \
    1600,24229,46857,69486,92114,114743,137371,160000 24229,92114,160000 > $OUT/w2v-steps.log 2> $OUT/w2v-steps.err
echo "steps rc $?"; tail -n 3 $OUT/w2v-steps.err; grep "^## length" $OUT/w2v-steps.log; tail -n 10 $OUT/w2v-steps.log
