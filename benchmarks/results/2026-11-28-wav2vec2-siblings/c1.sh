# call 1: wheels; the family-exec GPU tests (the sibling nodes of a variant's other launch form, and the tiny
# Wav2Vec2 range against onnxruntime); the full-size ONNX file built for the checks
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
[ -f models/full/wav2vec2.onnx ] || python3 models/build.py --size full --out models/full wav2vec2 > $OUT/build.log 2>&1 &
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_family_exec.py -k "sibling or match_onnxruntime" \
    > $OUT/family-tests.log 2>&1
echo "family tests rc $?"; grep -E "passed|failed|Error|assert" $OUT/family-tests.log | tail -n 8
wait; ls -l models/full/
