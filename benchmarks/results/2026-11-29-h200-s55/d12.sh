# d1.sh and d2.sh in one call (the machine goes after 30 s idle, and its bundles with it: session 55 lost a
# compile so). Calibrated at 32000 samples the compile should take some 4 minutes of the 10; each later step
# gets what is left: the traffic first (the figure the issue asks for), then the nodes, the parts, grapec bench.
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
C=out/bench/traffic-bundles; S=benchmarks/results/2026-11-29-h200-s55; M=models/full/wav2vec2.onnx
W="--calibrate-at 32000 --model wav2vec2 --size full --range 1600:160000 --precision fp16 --ideal-lengths 8 --requests 300"
python3 models/build.py --size full --out models/full wav2vec2 > $OUT/w2v-build.log 2>&1; echo "build rc $?"
( timeout 360 python3 benchmarks/traffic.py $W --compile-only --no-ideal > $OUT/w2v-range-compile.log 2>&1; echo "range rc $? at $(( $(date +%s) - START )) s" ) &
( timeout 300 python3 benchmarks/traffic.py $W --singles-only > $OUT/w2v-singles.log 2>&1; echo "singles rc $?"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 3 tests/test_gpu_family_exec.py tests/test_size_program.py \
      tests/test_codegen.py > $OUT/gpu-tests.log 2>&1; echo "tests rc $?"; tail -n 2 $OUT/gpu-tests.log ) &
wait
T=$(( $(left) - 60 )); [ $T -gt 150 ] && T=150; timeout $T python3 benchmarks/traffic.py $W --peers "" \
    --out $OUT/w2v-default > $OUT/w2v-default.log 2>&1; echo "traffic rc $? ($(left) s left)"
T=$(( $(left) - 5 )); [ $T -gt 70 ] && T=70; timeout $T python3 $S/node_times.py $M $C/wav2vec2-fp16-samples1600-160000.grape \
    "$C/wav2vec2-fp16-samples{n}.grape" 24229,46857 > $OUT/node-times.log 2>&1; echo "nodes rc $? ($(left) s left)"
T=$(( $(left) - 5 )); [ $T -gt 60 ] && T=60; timeout $T python3 benchmarks/results/2026-11-29-h200-s54/run_parts.py $M \
    $C/wav2vec2-fp16-samples1600-160000.grape "$C/wav2vec2-fp16-samples{n}.grape" 24229,46857 > $OUT/run-parts.log 2>&1
echo "parts rc $? ($(left) s left)"
T=$(( $(left) - 5 )); [ $T -gt 10 ] && timeout $T python3 -c "from grapec.tools.cli import main; main()" bench \
    $C/wav2vec2-fp16-samples1600-160000.grape --dim batch=1,samples=24229 --per-step 8 > $OUT/bench-24229.log 2>&1
echo "bench rc $?"; grep "eval_sizes\|^## " $OUT/node-times.log; tail -n 6 $OUT/run-parts.log
grep "uniform over 8" $OUT/w2v-default.log; tail -n 10 $OUT/bench-24229.log
