# call 5: BERT fp16 seq 1..512: the range compiled, its traffic (1000 requests, no ideal, no peers) and 16 random
# lengths against onnxruntime
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 560 python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --requests 1000 --no-ideal \
    --peers "" --check 16 --out $OUT/bert > $OUT/bert-traffic.log 2>&1
echo "bert traffic rc $?"; grep -v "graphs built\|check: length" $OUT/bert-traffic.log | tail -n 16
