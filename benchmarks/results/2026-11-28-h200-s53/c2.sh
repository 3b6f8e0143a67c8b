# session 53, call 2: GPT-2's range against its single-length bundles at the 8 lengths of the traffic's ideal
# (numpy, bound, replay, and numpy in random order), per step at the 5 lengths call 1 did not profile
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 560 python3 benchmarks/results/2026-11-28-h200-bert-gap/steps.py gpt2 1,74,147,220,293,366,439,512 1,147,293,366,512 \
    > $OUT/steps8.log 2> $OUT/steps8.err
echo "steps rc $?"; tail -n 3 $OUT/steps8.err; grep "^## length" $OUT/steps8.log; tail -n 10 $OUT/steps8.log
