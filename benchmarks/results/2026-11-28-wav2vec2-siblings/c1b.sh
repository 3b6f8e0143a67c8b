# cycle 2, call 1: wheels; the sibling-node GPU tests (driver behaviour, clusters, two-kernel variants)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
[ -f models/full/wav2vec2.onnx ] || python3 models/build.py --size full --out models/full wav2vec2 > $OUT/build.log 2>&1 &
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_family_exec.py -k "sibling or disabled" -rA \
    > $OUT/sibling-tests.log 2>&1
echo "sibling tests rc $?"; grep -E "^(PASSED|FAILED|ERROR)|^E  .*Error|passed|failed" $OUT/sibling-tests.log | tail -n 12
wait; ls -l models/full/
