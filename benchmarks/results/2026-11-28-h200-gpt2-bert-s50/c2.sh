# call 2 (warm machine, bundles of call 1): MODEL's traffic, 2000 requests, grapec's rows, the ideal and the
# PyTorch peers (their first 500 requests of each traffic), one process
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
M=$1
timeout 575 python3 benchmarks/traffic.py --model $M --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --peers torch,padded,compile --peer-requests 500 --out $OUT/$M > $OUT/$M-traffic.log 2>&1
echo "$M traffic rc $?"; tail -n 26 $OUT/$M-traffic.log
