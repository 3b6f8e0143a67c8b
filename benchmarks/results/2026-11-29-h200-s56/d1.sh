# Call A: the range compiled (calibrated at 32000 samples) beside the 8 singles and the GPU tests of the loader and
# the family execs; then the traffic's grapec and ideal rows (2000 requests a traffic), then each node's time.
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
C=out/bench/traffic-bundles; M=models/full/wav2vec2.onnx
W="--calibrate-at 32000 --model wav2vec2 --size full --range 1600:160000 --precision fp16 --ideal-lengths 8 --requests 2000"
python3 models/build.py --size full --out models/full wav2vec2 > $OUT/w2v-build.log 2>&1; echo "build rc $? at $(( $(date +%s) - START )) s"
( timeout 330 python3 benchmarks/traffic.py $W --compile-only --no-ideal > $OUT/w2v-range-compile.log 2>&1; echo "range rc $? at $(( $(date +%s) - START )) s" ) &
( timeout 300 python3 benchmarks/traffic.py $W --singles-only > $OUT/w2v-singles.log 2>&1; echo "singles rc $?"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 3 tests/test_gpu_family_exec.py tests/test_size_program.py \
      > $OUT/gpu-tests.log 2>&1; echo "tests rc $?"; tail -n 2 $OUT/gpu-tests.log ) &
wait
T=$(( $(left) - 45 )); [ $T -gt 220 ] && T=220; timeout $T python3 benchmarks/traffic.py $W --peers "" \
    --out $OUT/w2v > $OUT/w2v-traffic.log 2>&1; echo "traffic rc $? ($(left) s left)"
T=$(( $(left) - 5 )); [ $T -gt 40 ] && T=40; timeout $T python3 benchmarks/results/2026-11-29-h200-s55/node_times.py $M \
    $C/wav2vec2-fp16-samples1600-160000.grape "$C/wav2vec2-fp16-samples{n}.grape" 24229 > $OUT/node-times.log 2>&1
echo "nodes rc $? ($(left) s left)"
grep "eval_sizes\|^## " $OUT/node-times.log; grep -E "^\| grapec range \||^\| ideal" $OUT/w2v/traffic.md; grep -i "switch" $OUT/w2v/traffic.md | head -3
