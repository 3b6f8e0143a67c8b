# prepared for the next session (not run in session 52): GPT-2's traffic with bands of 1.5 (default), 1.25 and
# 1.1 (GRAPEC_BAND_RATIO: sizes sharing an exec within that ratio of launched blocks; each runs its band's widest
# GEMMs), the ideal in the same process, and 16 lengths against onnxruntime; whether narrower bands close the
# range's 1.16x (numpy) and at what memory
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
G="--model gpt2 --range 1:512 --precision fp16 --ideal-lengths 8 --requests 1000"
timeout 300 python3 benchmarks/traffic.py $G --compile-only > $OUT/gpt2-compile.log 2>&1; echo "compile rc $?"
timeout 280 python3 benchmarks/traffic.py $G --check 16 --peers "" --band-ratios 1.25,1.1 --out $OUT/gpt2-bands \
    > $OUT/gpt2-bands.log 2>&1
echo "bands rc $?"; grep -v "graphs built\|check: length" $OUT/gpt2-bands.log | tail -n 24
