# call B (warm, after sweep.sh): BERT's range as traffic with shared execs by bands of sizes: the default
# ratio (1.5), one exec per structure (0) and 1.25, against the ideal measured in the same run
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --peers "" --band-ratios 0,1.25 --out $OUT/bert > $OUT/bert-bands.log 2>&1
echo "rc $?"; tail -30 $OUT/bert-bands.log
