# call with the little device time left (the machine went between d1.sh and d2.sh, its bundles with it): full
# Wav2Vec2 over 20000..32000 samples only (its own bands, not the whole range's) and the 24229 single; then the
# run's parts (the switch fix) and each node of the band exec against the single's
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
C=out/bench/narrow; S=benchmarks/results/2026-11-29-h200-s55; mkdir -p $C
python3 models/build.py --size full --out models/full wav2vec2 > $OUT/w2v-build.log 2>&1; echo "build rc $?"
M=models/full/wav2vec2.onnx
( timeout 100 python3 -c "import grapec; grapec.compile('$M', dims={'batch': 1}, dynamic={'samples': (20000, 32000)}, precision='fp16').write('$C/r.grape')" > $OUT/range.log 2>&1; echo "range rc $?" ) &
( OMP_NUM_THREADS=4 timeout 100 python3 -c "import grapec; grapec.compile('$M', dims={'batch': 1, 'samples': 24229}, precision='fp16', jobs=1).write('$C/s24229.grape')" > $OUT/single.log 2>&1; echo "single rc $?" ) &
wait
timeout 30 python3 benchmarks/results/2026-11-29-h200-s54/run_parts.py $M $C/r.grape "$C/s{n}.grape" 24229 > $OUT/run-parts.log 2>&1; echo "parts rc $?"
timeout 40 python3 $S/node_times.py $M $C/r.grape "$C/s{n}.grape" 24229 > $OUT/node-times.log 2>&1; echo "nodes rc $?"
tail -n 3 $OUT/run-parts.log; grep -A 14 "group | single" $OUT/node-times.log
