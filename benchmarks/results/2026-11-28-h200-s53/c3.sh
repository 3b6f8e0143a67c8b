# session 53, call 3: GPT-2 fp16 seq 1..512, the range (with the mapping fix, 1a75b80) and the 8 single-length bundles
# of the ideal compiled into the cache; call 4 times them while the machine is warm
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
G="--model gpt2 --range 1:512 --precision fp16 --ideal-lengths 8 --requests 1000"
timeout 560 python3 benchmarks/traffic.py $G --compile-only > $OUT/gpt2-compile.log 2>&1; echo "compile rc $?"
grep -v "^\[" $OUT/gpt2-compile.log | tail -n 4; tail -n 2 $OUT/gpt2-compile.log; ls out/bench/traffic-bundles | wc -l
