# call C (any machine): torch.compile on BERT, and GPT-2's one-CUDA-graph-per-length row
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --only-peers --peers compile --out $OUT/bert-compile > $OUT/bert-compile-peer.log 2>&1; echo "rc $?"
python3 benchmarks/traffic.py --model gpt2 --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --only-peers --peers torch --out $OUT/gpt2-torch > $OUT/gpt2-torch.log 2>&1; echo "rc $?"
tail -8 $OUT/bert-compile/traffic.md $OUT/gpt2-torch/traffic.md
python3 benchmarks/traffic.py --model bert --range 1:512 --precision fp16 --ideal-lengths 8 --requests 2000 \
    --only-peers --peers torch,padded --out $OUT/bert-torch > $OUT/bert-torch.log 2>&1; echo "rc $?"
tail -12 $OUT/bert-torch/traffic.md
