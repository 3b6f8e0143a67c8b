# Session 61, calls 6-8, run by hand on the machine call 5 left warm (its /tmp/site with onnxruntime-gpu and
# onnxruntime-genai, its /tmp/llm builds), at the code of call 5.
export PYTHONPATH=/tmp/site:src:tests:models:benchmarks
export LD_LIBRARY_PATH=$(python3 -c "import glob, site; print(':'.join(glob.glob(site.getsitepackages()[0] + '/nvidia/*/lib')))"):$LD_LIBRARY_PATH
case "$1" in
6)  # the int4 decode step's kernels alone at batch 4 and 16
    for rows in 4 16; do python3 benchmarks/llm.py --model /tmp/llm/llama1b_int4/model.onnx --steps --step-batch $rows \
        --prompt 128 --new 256 --prefill 0 --json $OUT/steps-$rows.json > $OUT/steps-$rows.log 2>&1; done ;;
7)  # the fp16 builder export against onnxruntime-genai
    python3 models/llm.py llama1b --out /tmp/llm --precision fp16 --builder-dir /tmp/site/onnxruntime_genai/models \
        > $OUT/build-fp16.log 2>&1
    python3 benchmarks/llm.py --model /tmp/llm/llama1b_fp16/model.onnx --batch 1 4 16 --prompt 128 --new 256 --prefill 0 \
        --peers genai,genai-graph --iterations 3 --json $OUT/fp16.json > $OUT/fp16.log 2>&1 ;;
8)  # fp16 at batch 16 against the torch.compile static-cache loop on the same weights
    python3 benchmarks/llm.py --model /tmp/llm/llama1b_fp16/model.onnx --hf /tmp/llm/llama1b_hf --batch 16 --prompt 128 \
        --new 256 --prefill 0 --peers compile --iterations 3 --json $OUT/compile.json > $OUT/compile.log 2>&1 ;;
esac
