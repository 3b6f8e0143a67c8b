# GPT-J-6B-shaped (issue 35: Grape's model), fp16, on the GPU machine: `bash next-gptj.sh build` then, back to back
# while the machine is warm, `bash next-gptj.sh run`. Carry .whl (its optimum/ folder: optimum 2.1.0, optimum-onnx
# 0.1.0 and the transformers 4.57.6, tokenizers 0.22.2 and huggingface_hub 0.36.2 they need, installed apart so
# that the machine's own transformers stays the peers'). build: the checkpoint (random weights, save_pretrained)
# and optimum's export (text-generation-with-past, fp16, on the GPU; 12 GB of external data). run: grapec's
# generation (prompt 128, 256 new tokens) at batch 1 against the weight-read limit, HF eager beside it.
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
M=${2:-gptj6b}; ONNX=/tmp/llm/${M}_optimum_fp16/model.onnx
if [ "$1" = build ]; then
    [ -d /tmp/optsite ] || python3 -m pip install -q --no-index --no-deps --target /tmp/optsite .whl/optimum/*.whl
    PYTHONPATH=/tmp/optsite:$PYTHONPATH timeout $(( $(left) - 5 )) python3 models/llm.py $M --out /tmp/llm \
        --precision fp16 --exporter optimum --provider cuda > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
    tail -n 3 $OUT/build.log; du -sh /tmp/llm/${M}_optimum_fp16; exit
fi
timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model $ONNX --hf /tmp/llm/${M}_hf --batch 1 --prompt 128 \
    --new 256 --prefill 0 --peers hf --iterations 3 --json $OUT/gptj.json > $OUT/gptj.log 2>&1; echo "run rc $? ($(left) s left)"
grep -E "failed|rror" $OUT/gptj.log | cut -c1-200 | head -4; tail -n 6 $OUT/gptj.log
