# call 5 (the last of the budget): BERT's seq 1..512 range and 8 single-length bundles compiled, then its traffic,
# grapec's rows and the ideal only (the attention-tiling change touches BERT's ranges too)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 250 python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --peers "" --out $OUT/bert > $OUT/bert-traffic.log 2>&1
echo "bert traffic rc $?"; grep -E "launch structures" $OUT/bert-traffic.log | cut -c1-200; tail -n 12 $OUT/bert-traffic.log
