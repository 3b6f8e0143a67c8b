# call A: BERT's range and 8 single-length bundles compiled (background) while the generated attention
# kernel's tilings are timed against cuDNN at BERT's lengths (benchmarks/attention_batch.py)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
( python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --compile-only > $OUT/bert-compile.log 2>&1; echo "compile rc $?" >> $OUT/bert-compile.log ) &
python3 benchmarks/attention_batch.py --shapes 1x12x147x64,1x12x293x64,1x12x400x64,1x12x512x64,8x12x128x64,32x12x128x64 \
    --variants default,cudnn,w1s1,w1s2,w1s4,w2s1,w4s1,w8s1 > $OUT/attention-sweep.log 2>&1
echo "sweep rc $?"
wait
tail -9 $OUT/attention-sweep.log; tail -2 $OUT/bert-compile.log
