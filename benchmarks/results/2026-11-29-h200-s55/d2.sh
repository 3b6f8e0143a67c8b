# call after d1.sh on the same warm machine: the run's parts (the switch joined its sizes at every run before),
# each node of the band exec against the single bundle's, then the traffic at the default band ratio
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
C=out/bench/traffic-bundles; S=benchmarks/results/2026-11-29-h200-s55
W="--model wav2vec2 --size full --range 1600:160000 --precision fp16 --ideal-lengths 8 --requests 300"
timeout 120 python3 benchmarks/results/2026-11-29-h200-s54/run_parts.py models/full/wav2vec2.onnx \
    $C/wav2vec2-fp16-samples1600-160000.grape "$C/wav2vec2-fp16-samples{n}.grape" 24229,46857,92114 > $OUT/run-parts.log 2>&1
echo "parts rc $?"
timeout 150 python3 $S/node_times.py models/full/wav2vec2.onnx $C/wav2vec2-fp16-samples1600-160000.grape \
    "$C/wav2vec2-fp16-samples{n}.grape" 24229,46857 > $OUT/node-times.log 2>&1
echo "nodes rc $?"
timeout 200 python3 benchmarks/traffic.py $W --peers "" --out $OUT/w2v-default > $OUT/w2v-default.log 2>&1
echo "traffic rc $?"; grep "eval_sizes\|^## " $OUT/node-times.log; grep -A 12 "| length 24229: group" $OUT/node-times.log
timeout 90 python3 -c "from grapec.tools.cli import main; main()" bench $C/wav2vec2-fp16-samples1600-160000.grape \
    --dim batch=1,samples=24229 --per-step 8 > $OUT/bench-24229.log 2>&1; echo "bench rc $?"
tail -n 8 $OUT/run-parts.log; grep "uniform over 8" $OUT/w2v-default.log; tail -n 12 $OUT/bench-24229.log
