#!/usr/bin/env bash
# Idempotent set-up on the GPU machine for a verification run (see README, "GPU machine"):
# wheels, the full-size zoo, and the bundles compiled on the CPU-only machine, restored byte for
# byte from gpu_carry/ (tools/bundle_weights.py) into gpu_bundles/.
set -e
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null || true; fi
export PYTHONPATH=/tmp/site:src:tests PYTHONUNBUFFERED=1
missing=""
for m in gpt2 bert wav2vec2 resnet50 googlenet control_flow; do [ -f models/full/$m.onnx ] || missing="$missing $m"; done
if [ -n "$missing" ]; then python3 models/build.py --size full --out models/full $missing; fi
if [ -f gpu_carry/full_sha.txt ]; then
  if sha256sum --quiet -c gpu_carry/full_sha.txt; then echo "full-size ONNX files: byte-identical to the CPU machine's";
  else echo "full-size ONNX files differ from the CPU machine's"; fi
fi
mkdir -p gpu_bundles
cp -n gpu_carry/*.grape gpu_bundles/ 2>/dev/null || true
for f in gpu_carry/*.nw; do
  out=gpu_bundles/$(basename "$f" .nw).grape
  [ -f "$out" ] || python3 tools/bundle_weights.py restore "$f" "$out" --models models/full
done
