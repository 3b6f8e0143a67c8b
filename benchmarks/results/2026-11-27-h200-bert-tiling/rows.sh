# call B (right after A, on the warm machine): grapec's rows, the ideal three ways, torch graphs and padding
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --peers torch,padded --out $OUT/bert > $OUT/bert-rows.log 2>&1
echo "rc $?"; tail -24 $OUT/bert-rows.log
