# session 53, call 4: GPT-2's traffic (1000 requests each) through the range, its ideal in the same process, and a
# band ratio of 1.25 beside the default 1.5; 16 random lengths against onnxruntime; no PyTorch peers (session 52's)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
G="--model gpt2 --range 1:512 --precision fp16 --ideal-lengths 8 --requests 1000"
timeout 560 python3 benchmarks/traffic.py $G --check 16 --peers "" --band-ratios 1.25 --out $OUT/gpt2-traffic \
    > $OUT/gpt2-traffic.log 2>&1
echo "traffic rc $?"; grep -v "graphs built\|check: length\|^\[traffic\] request" $OUT/gpt2-traffic.log | tail -n 24
