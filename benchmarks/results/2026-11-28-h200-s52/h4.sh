# call 4: GPT-2 fp16 seq 1..512: the range and 8 single-length bundles compiled, then the traffic (2000 requests):
# grapec's rows, the ideal, 16 random lengths against onnxruntime, and the PyTorch peers on 300 requests a traffic
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
G="--model gpt2 --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000"
timeout 230 python3 benchmarks/traffic.py $G --compile-only > $OUT/gpt2-compile.log 2>&1; echo "compile rc $?"
timeout 350 python3 benchmarks/traffic.py $G --check 16 --peers padded,torch,compile --peer-requests 300 --out $OUT/gpt2 \
    > $OUT/gpt2-traffic.log 2>&1
echo "gpt2 traffic rc $?"; grep -v "graphs built\|check: length" $OUT/gpt2-traffic.log | tail -n 24
