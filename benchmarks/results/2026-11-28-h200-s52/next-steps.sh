# prepared for the next session (not run in session 52): where GPT-2's range loses to its single-length bundles
# now that the host copy no longer hides it (1.16x numpy, session 52): per step, the range's shared exec against
# the single-length bundle at three lengths, and numpy / bound / replay times of each
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 560 python3 benchmarks/results/2026-11-28-h200-bert-gap/steps.py gpt2 74,220,439 > $OUT/steps.log 2> $OUT/steps.err
echo "rc $?"; tail -3 $OUT/steps.err; tail -6 $OUT/steps.log
