START=$(date +%s); left() { echo $(( 560 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 tests/test_attention.py > $OUT/attn.log 2>&1; echo "attention rc $? ($(left) s left)"; tail -n 2 $OUT/attn.log
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 -rs --ignore=tests/test_gpu_full.py --ignore=tests/test_attention.py tests > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $? ($(left) s left)"; tail -n 4 $OUT/gpu-tests.log
timeout $(( $(left) - 5 )) python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 -rs tests/test_gpu_full.py > $OUT/gpu-full.log 2>&1; echo "gpu full rc $? ($(left) s left)"; tail -n 3 $OUT/gpu-full.log
