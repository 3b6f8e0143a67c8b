# Branch wip/fp16-staged-split against main, in one call: half weights of at least 1 MiB at 2-16 rows with A read
# as it lies take the staged split form. Before it, on the branch: `rm -rf .ab && mkdir -p .ab/main && git archive
# main src | tar -x -C .ab/main`; carry .ab and the nvmath, cudnn frontend, onnx_ir, onnxscript, ml_dtypes and
# onnxruntime_genai wheels. The GPU tests first (a failure: stop and read them), then the Llama-1B-shaped fp16
# builder export's loop at batch 1, 4 and 16 on each side, then GPT-2 and BERT (fp16, batch 1, seq 8 and 16).
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
    .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl 2>/dev/null
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_small_gemm.py tests/test_packed_small_gemm.py \
    tests/test_grid_stitch.py > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $? ($(left) s left)"
tail -n 1 $OUT/gpu-tests.log; grep -E "^FAILED" $OUT/gpu-tests.log | cut -c1-200 | head -8
ONNX=/tmp/llm/llama1b_fp16/model.onnx
[ -f $ONNX ] || timeout 200 python3 models/llm.py llama1b --out /tmp/llm --precision fp16 \
    --builder-dir /tmp/site/onnxruntime_genai/models > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
rm -rf /tmp/root-main && mkdir /tmp/root-main && ln -s $PWD/.ab/main/src /tmp/root-main/src
for d in benchmarks models tests; do ln -s $PWD/$d /tmp/root-main/$d; done
for side in new main; do
    root=$PWD; [ $side = main ] && root=/tmp/root-main
    PYTHONPATH=/tmp/site:$root/src:tests:models:benchmarks timeout 130 python3 $root/benchmarks/llm.py --model $ONNX \
        --batch 1 4 16 --prompt 128 --new 256 --prefill 0 --peers none --iterations 3 > $OUT/loop-$side.log 2>&1
    echo "$side loop rc $? ($(left) s left)"
done
for side in new main; do echo "== $side"; grep -E "^\| (1|4|16) " $OUT/loop-$side.log | cut -c1-60; done
python3 models/build.py --size full --out models/full gpt2 bert > $OUT/build-full.log 2>&1
for side in new main; do
    root=$PWD; [ $side = main ] && root=/tmp/root-main
    for m in gpt2 bert; do for seq in 8 16; do
        PYTHONPATH=/tmp/site:$root/src timeout 60 python3 -c "import sys; sys.argv[0] = 'grapec'; from grapec.tools.cli import main; main()" \
            bench models/full/$m.onnx --precision fp16 --dim batch=1,seq=$seq --iterations 500 2>&1 | grep -iE "median|ms" \
            | head -2 | sed "s/^/$side $m s$seq: /"
    done; done
done
