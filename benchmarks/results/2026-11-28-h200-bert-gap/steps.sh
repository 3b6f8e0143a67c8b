# one call: BERT fp16's range and single-length bundles compiled, then steps.py at three lengths
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 benchmarks/results/2026-11-28-h200-bert-gap/steps.py 147,293,400 > $OUT/steps.log 2> $OUT/steps.err
echo "rc $?"; tail -3 $OUT/steps.err; tail -6 $OUT/steps.log
