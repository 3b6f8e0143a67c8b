# call 2: full Wav2Vec2's traffic (1000 requests a traffic): grapec's rows, the ideal (single-length bundles) and 16
# random lengths against onnxruntime; a request over 100 ms is named as it happens
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 580 python3 benchmarks/traffic.py --model wav2vec2 --size full --range 1600:160000 --precision fp16 \
    --ideal-lengths 8 --requests 1000 --peers "" --check 16 --out $OUT/w2v > $OUT/w2v-traffic.log 2>&1
echo "traffic rc $?"; grep -v "graphs built\|check: length" $OUT/w2v-traffic.log | tail -n 24
