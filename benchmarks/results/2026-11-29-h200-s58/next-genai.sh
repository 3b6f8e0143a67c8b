# onnxruntime-genai-cuda 0.18.0 (with onnxruntime-gpu 1.31.1) against grapec on the full Llama-1B-shaped builder
# export, fp16, in one process. The two packages' files travel as an xz tar in 6 parts (.ort/part_a[a-f], made by
# `split -b 38M`: the working tree takes the rest of 64 MiB): `bash next-genai.sh part` in one call a part (carry .ort/part_aX), then
# `bash next-genai.sh run` with .whl and .ort/SHA256 carried, back to back while the machine is warm.
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
if [ "$1" = part ]; then
    mkdir -p /tmp/ortparts; for p in .ort/part_a?; do cp -n $p /tmp/ortparts/; done; ls -la /tmp/ortparts; exit
fi
cat /tmp/ortparts/part_a? > /tmp/ort.tar.xz
echo "$(cut -d' ' -f1 .ort/SHA256)  /tmp/ort.tar.xz" | sha256sum -c || exit 1
mkdir -p /tmp/site && xz -d < /tmp/ort.tar.xz | tar -x -C /tmp/site
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl .whl/ml_dtypes*.whl
export LD_LIBRARY_PATH=$(python3 -c "import glob, site; print(':'.join(glob.glob(site.getsitepackages()[0] + '/nvidia/*/lib')))"):$LD_LIBRARY_PATH
python3 -c "import onnxruntime as o, onnxruntime_genai as g; print('ort', o.__version__, o.get_available_providers(), 'genai', g.__version__)"
M=llama1b; ONNX=/tmp/llm/${M}_fp16/model.onnx
[ -f $ONNX ] || timeout 240 python3 models/llm.py $M --out /tmp/llm --precision fp16 \
    --builder-dir /tmp/site/onnxruntime_genai/models > $OUT/build.log 2>&1; echo "build rc $? ($(left) s left)"
timeout $(( $(left) - 150 )) python3 benchmarks/llm.py --model $ONNX --batch 1 4 16 --prompt 128 --new 256 --prefill 1024 \
    --peers genai,genai-graph --iterations 3 --json $OUT/genai.json > $OUT/genai.log 2>&1; echo "genai rc $? ($(left) s left)"
[ -d /tmp/llm/${M}_hf ] && timeout $(( $(left) - 5 )) python3 benchmarks/llm.py --model $ONNX --hf /tmp/llm/${M}_hf \
    --batch 1 16 --prompt 128 --new 256 --prefill 0 --peers compile --iterations 3 --json $OUT/compile.json \
    > $OUT/compile.log 2>&1; echo "compile rc $? ($(left) s left)"
grep -E "failed|error" $OUT/genai.log | head -5; tail -n 6 $OUT/genai.log; tail -n 4 $OUT/compile.log
