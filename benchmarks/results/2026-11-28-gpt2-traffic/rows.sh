# call A: GPT-2 fp16 over seq 1..512: the range and 8 single-length bundles compiled, then grapec's rows
# (numpy, bound) and the ideal, in one process
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
date
timeout 570 python3 benchmarks/traffic.py --model gpt2 --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --peers "" --out $OUT/gpt2 > $OUT/gpt2-rows.log 2>&1
echo "rc $?"; date; grep -E "compiled in|switch|limit" $OUT/gpt2-rows.log | head -5; tail -12 $OUT/gpt2-rows.log
