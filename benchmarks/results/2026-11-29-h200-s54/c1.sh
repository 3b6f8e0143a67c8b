# call 1: full Wav2Vec2's ONNX file, its range 1600:160000 and the ideal's 8 single-length bundles (cache kept while warm)
bash benchmarks/results/2026-11-28-h200-s52/next-w2v-bands.sh compile
