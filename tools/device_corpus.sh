#!/usr/bin/env bash
# The corpus on the GPU machine, which has no package index: the ONNX files travel from this
# machine's cache (tools/corpus.py names them ID.onnx) in parts under the device link's 64 MiB.
# A file over the limit travels split (ID.onnx.part-aa, -ab ... and ID.onnx.parts, the count), a
# part per call while the machine stays warm, and is joined here when its last part arrives.
# Usage, in a device call that carries .whl and .corpus_carry (or the folder $CORPUS_CARRY names):
#   bash tools/device_corpus.sh [fp32,fp16]    # runs the files this call completed; JSON to $OUT
set -e
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || true
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 GRAPEC_CORPUS_DIR=/tmp/grapec-corpus
mkdir -p $GRAPEC_CORPUS_DIR/files /tmp/corpus-parts
ids=""
for f in ${CORPUS_CARRY:-.corpus_carry}/*; do
  case "$f" in
    *.onnx) cp "$f" $GRAPEC_CORPUS_DIR/files/; ids="$ids$(basename "$f" .onnx),";;
    *) cp "$f" /tmp/corpus-parts/;;
  esac
done
for count in /tmp/corpus-parts/*.parts; do
  [ -e "$count" ] || continue
  stem=${count%.parts}; id=$(basename "$stem" .onnx)
  if [ "$(ls "$stem".part-* 2>/dev/null | wc -l)" = "$(cat "$count")" ] && [ ! -f $GRAPEC_CORPUS_DIR/files/$id.onnx ]; then
    cat "$stem".part-* > $GRAPEC_CORPUS_DIR/files/$id.onnx; ids="$ids$id,"
  fi
done
echo "files this call: $ids"
[ -n "$ids" ] || exit 0
python3 tools/corpus.py run --backend cuda --precision "${1:-fp32,fp16}" --only "$ids" --workers 4 \
  --json "$OUT/corpus_cuda_$(date +%H%M%S).json"
