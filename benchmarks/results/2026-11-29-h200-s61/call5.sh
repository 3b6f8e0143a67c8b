# Session 61, call 5 (branch wip/int4-small-gemm): the packed split form with a lane's 32 codes a load, against
# onnxruntime-genai-cuda 0.18.0 (onnxruntime-gpu 1.31.1) in one process. First `bash call5.sh part` in one call a
# part (carry .ort2/part_aX: onnxruntime-gpu and onnxruntime-genai as an xz tar cut by `split -b 37000000`; the last part may travel with the run), then `bash call5.sh` with .ab (.ab/split/src:
# the split form before the 32-code loads), .ort/SHA256 and the nvmath, onnx_ir, onnxscript, ml_dtypes wheels
# carried, back to back while the machine is warm. The GPU tests first: if they fail, the genai comparison runs
# .ab's code instead, and says so.
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
mkdir -p /tmp/ortparts; for p in .ort2/part_a?; do cp -n $p /tmp/ortparts/ 2>/dev/null; done
if [ "$1" = part ]; then ls -la /tmp/ortparts; exit; fi
cat /tmp/ortparts/part_a? > /tmp/ort.tar.xz
echo "$(cut -d' ' -f1 .ort/SHA256)  /tmp/ort.tar.xz" | sha256sum -c || exit 1
mkdir -p /tmp/site && xz -d < /tmp/ort.tar.xz | tar -x -C /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/nvmath*.whl .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl
export LD_LIBRARY_PATH=$(python3 -c "import glob, site; print(':'.join(glob.glob(site.getsitepackages()[0] + '/nvidia/*/lib')))"):$LD_LIBRARY_PATH
export PYTHONPATH=/tmp/site:src:tests:models:benchmarks; mkdir -p out/bench/traffic-bundles
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import onnxruntime as o, onnxruntime_genai as g; print('ort', o.__version__, o.get_available_providers(), 'genai', g.__version__)"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_packed_small_gemm.py tests/test_matmul_nbits.py \
    tests/test_genai_models.py tests/test_small_gemm.py > $OUT/gpu-tests.log 2>&1; rc=$?; echo "gpu tests rc $rc ($(left) s left)"
tail -n 1 $OUT/gpu-tests.log; grep -E "^FAILED" $OUT/gpu-tests.log | cut -c1-200 | head -8
rm -rf /tmp/root-split && mkdir /tmp/root-split && ln -s $PWD/.ab/split/src /tmp/root-split/src
for d in benchmarks models tests; do ln -s $PWD/$d /tmp/root-split/$d; done
ONNX=/tmp/llm/llama1b_int4/model.onnx
[ -f $ONNX ] || timeout 200 python3 models/llm.py llama1b --out /tmp/llm --precision int4 \
    --builder-dir /tmp/site/onnxruntime_genai/models > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
PYTHONPATH=/tmp/site:/tmp/root-split/src:tests:models:benchmarks timeout 120 python3 /tmp/root-split/benchmarks/llm.py \
    --model $ONNX --batch 1 4 16 --prompt 128 --new 256 --prefill 0 --peers none --iterations 3 > $OUT/loop-split.log 2>&1
echo "split loop rc $? ($(left) s left)"; grep -E "^\| (1|4|16) " $OUT/loop-split.log | cut -c1-60
root=$PWD; [ $rc = 0 ] || { root=/tmp/root-split; echo "THE GPU TESTS FAILED: genai runs against .ab/split"; }
PYTHONPATH=/tmp/site:$root/src:tests:models:benchmarks timeout $(( $(left) - 5 )) python3 $root/benchmarks/llm.py \
    --model $ONNX --batch 1 4 16 --prompt 128 --new 256 --prefill 0 --peers genai,genai-graph --iterations 3 \
    --json $OUT/int4.json > $OUT/int4.log 2>&1; echo "int4 rc $? ($(left) s left)"
grep -E "failed" $OUT/int4.log | cut -c1-160 | head -3; tail -n 7 $OUT/int4.log | cut -c1-260
