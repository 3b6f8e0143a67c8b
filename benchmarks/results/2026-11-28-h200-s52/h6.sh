# call 6 (a fresh machine, the wheels carried): the page-locked outputs' GPU test again (blocks now powers of two),
# while full BERT's range (seq 1..512, fp16) is compiled, then its traffic (500 requests, no ideal, no peers) and 16
# random lengths against onnxruntime
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
( timeout 250 python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --requests 500 --no-ideal \
    --peers "" --check 16 --out $OUT/bert > $OUT/bert-traffic.log 2>&1; echo "bert traffic rc $?" >> $OUT/bert-traffic.log ) &
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_host_arrays.py -rA > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc $?"; grep -E "^(PASSED|FAILED|ERROR)|^E  .*Error|passed|failed" $OUT/gpu-tests.log | tail -n 8
wait; grep -v "graphs built\|range: .* sizes compiled (" $OUT/bert-traffic.log | tail -n 24
