# call 2 (warm machine, bundles of call 1): GPT-2's traffic, 2000 requests, grapec's rows, the ideal and the
# PyTorch peers (their first 500 requests of each traffic), one process
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 575 python3 benchmarks/traffic.py --model gpt2 --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --peers torch,padded,compile --peer-requests 500 --out $OUT/gpt2 > $OUT/gpt2-traffic.log 2>&1
echo "gpt2 traffic rc $?"; tail -n 26 $OUT/gpt2-traffic.log
