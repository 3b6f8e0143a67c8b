# call 3 (later in the session): the IOBinding fix on the GPU. BERT's range compiled (its cubin and PTX side
# by side now) while the IOBinding GPU tests run; then BERT's traffic, grapec's rows only (numpy and bound)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
( python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --no-ideal --requests 2000 --compile-only \
    > $OUT/bert-compile-2.log 2>&1; echo "compile rc $?" >> $OUT/bert-compile-2.log ) &
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_iobinding.py -rA > $OUT/iobinding-tests.log 2>&1
echo "iobinding tests rc $?" >> $OUT/iobinding-tests.log
wait
grep -E "^(FAILED|ERROR)|passed|failed|rc " $OUT/iobinding-tests.log | tail -n 5; grep -E "CUDA code|rc " $OUT/bert-compile-2.log
timeout 300 python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --no-ideal --requests 2000 \
    --peers "" --out $OUT/bert2 > $OUT/bert-traffic-2.log 2>&1
echo "traffic rc $?"; tail -n 12 $OUT/bert-traffic-2.log
