# prepared for the next session (not run in session 54), after `bash benchmarks/results/2026-11-28-h200-s52/next-w2v-bands.sh
# compile` on the same warm machine: where a full Wav2Vec2 family size's run spends what its exec's replay does not.
# Session 54 (steps.py, same lengths): range bound 1.118 ms against a replay of 0.730 at 46857 samples, the single
# bundle 0.749 against 0.634; tiny Wav2Vec2 showed no such gap (run_parts.py, call 7), so it grows with the model.
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
C=out/bench/traffic-bundles
timeout 500 python3 benchmarks/results/2026-11-29-h200-s54/run_parts.py models/full/wav2vec2.onnx \
    $C/wav2vec2-fp16-samples1600-160000.grape "$C/wav2vec2-fp16-samples{n}.grape" 24229,46857,92114 \
    > $OUT/run-parts-full.log 2>&1
echo "parts rc $?"; tail -n 8 $OUT/run-parts-full.log
