# session 53, call 5 (calls 3-4 in one: the machine was given back between them, and with it the compiled bundles):
# GPT-2 fp16 seq 1..512 after the mapping fix (1a75b80): the range and the 8 single-length bundles compiled, then
# the traffic (1000 requests each) through the range and its ideal in the same process, 8 random lengths against
# onnxruntime; no PyTorch peers (session 52's), no band ratios
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
G="--model gpt2 --range 1:512 --precision fp16 --ideal-lengths 8 --requests 1000"
timeout 320 python3 benchmarks/traffic.py $G --compile-only > $OUT/gpt2-compile.log 2>&1; echo "compile rc $?"
timeout 230 python3 benchmarks/traffic.py $G --check 8 --peers "" --out $OUT/gpt2-traffic > $OUT/gpt2-traffic.log 2>&1
echo "traffic rc $?"; grep -v "graphs built\|check: length\|^\[traffic\] request" $OUT/gpt2-traffic.log | tail -n 20
