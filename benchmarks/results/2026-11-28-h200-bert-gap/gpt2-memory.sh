# call C: the two shared-exec GPU tests whose exec counts the bands changed, then GPT-2 fp16 over seq 1..512:
# device memory with bands (default 1.5) and with one exec per structure (0), against the limit
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_dynamic.py -k "share_one_exec or formulas_run_on_the_gpu" > $OUT/gpu-tests-bands-2.log 2>&1
echo "tests rc $?"; tail -2 $OUT/gpu-tests-bands-2.log
python3 benchmarks/traffic.py --model gpt2 --range 1:512 --precision fp16 --requests 50 --no-ideal --peers "" \
    --band-ratios 0 --out $OUT/gpt2 > $OUT/gpt2-bands.log 2>&1
echo "rc $?"; grep -E "memory limit|instantiated" $OUT/gpt2-bands.log | head -3; grep -E "\| grapec range(, band ratio 0)? \| uniform" $OUT/gpt2-bands.log
