# int4 against onnxruntime-genai-cuda 0.18.0 (onnxruntime-gpu 1.31.1) in one process, after the int4 GEMV changes:
# the parts first (`bash ../2026-11-29-h200-s58/next-genai.sh part`, one call a part, .ort/part_aX carried), then
# this with .whl and .ort/SHA256 carried, back to back while the machine is warm. It runs the GPU tests of the
# GEMV (against MatMulNBits' spec) and of the builder models, builds the Llama-1B-shaped builder export in int4,
# and times grapec, genai and genai's CUDA graph at batch 1, 4 and 16 (prompt 128, 256 new tokens).
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
cat /tmp/ortparts/part_a? > /tmp/ort.tar.xz
echo "$(cut -d' ' -f1 .ort/SHA256)  /tmp/ort.tar.xz" | sha256sum -c || exit 1
mkdir -p /tmp/site && xz -d < /tmp/ort.tar.xz | tar -x -C /tmp/site
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl .whl/ml_dtypes*.whl
export LD_LIBRARY_PATH=$(python3 -c "import glob, site; print(':'.join(glob.glob(site.getsitepackages()[0] + '/nvidia/*/lib')))"):$LD_LIBRARY_PATH
python3 -c "import onnxruntime as o, onnxruntime_genai as g; print('ort', o.__version__, o.get_available_providers(), 'genai', g.__version__)"
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 tests/test_matmul_nbits.py tests/test_genai_models.py \
    > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $? ($(left) s left)"; tail -n 2 $OUT/gpu-tests.log
M=llama1b; ONNX=/tmp/llm/${M}_int4/model.onnx
[ -f $ONNX ] || timeout 240 python3 models/llm.py $M --out /tmp/llm --precision int4 \
    --builder-dir /tmp/site/onnxruntime_genai/models > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model $ONNX --batch 1 4 16 --prompt 128 --new 256 --prefill 0 \
    --peers genai,genai-graph --iterations 3 --json $OUT/int4.json > $OUT/int4.log 2>&1; echo "int4 rc $? ($(left) s left)"
grep -E "failed|rror" $OUT/int4.log | cut -c1-200 | head -4; tail -n 8 $OUT/int4.log
