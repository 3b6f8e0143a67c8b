# call 1 (carries the wheels; the parts go alone: the tree and a part fill a call): the GPU tests of this session's change (small GEMMs merged across row counts: the
# block range, GPT-2 fp16 ranges), while the full Wav2Vec2 ONNX file is built
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
D=benchmarks/results/2026-11-28-h200-w2v-rows

if [ ! -f models/full/wav2vec2.onnx ]; then python3 models/build.py --size full --out models/full wav2vec2 > $OUT/build.log 2>&1 & fi
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_small_gemm.py tests/test_gpu_dynamic.py -rA > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc $?"; grep -E "^(FAILED|ERROR)|^E  .*Error|passed|failed" $OUT/gpu-tests.log | tail -n 12
wait; ls -l models/full/
