# call 3: the traffic, grapec's rows and the ideal (single-length bundles compiled in call 2); then 16 lengths on the
# GPU against the same bundle on the CPU backend
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
D=benchmarks/results/2026-11-28-wav2vec2-full-gpu
B=out/bench/traffic-bundles/wav2vec2-fp16-samples1600-160000.grape
timeout 420 python3 benchmarks/traffic.py --model wav2vec2 --size full --range 1600:160000 --precision fp16 \
    --ideal-lengths 8 --requests 1000 --peers "" --out $OUT > $OUT/traffic-grapec.log 2>&1
echo "traffic rc $?"; grep -v "graphs built" $OUT/traffic-grapec.log | tail -n 24; grep "graphs built" $OUT/traffic-grapec.log | tail -n 4
timeout 150 python3 $D/check16.py $B models/full/wav2vec2.onnx cuda --ref-cpu-backend > $OUT/check16-gpu-vs-cpu.log 2>&1
echo "check16 rc $?"; tail -n 17 $OUT/check16-gpu-vs-cpu.log
