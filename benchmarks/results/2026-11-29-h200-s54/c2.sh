# call 2: full Wav2Vec2's traffic at band ratios 1.5 (default), 1.25 and 1.1, with the ideal, 300 requests a traffic
bash benchmarks/results/2026-11-28-h200-s52/next-w2v-bands.sh traffic
