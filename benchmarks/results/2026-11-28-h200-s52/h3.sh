# call 3: the PyTorch peers of full Wav2Vec2 on the first 200 requests of each traffic (same lengths, seeds)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 580 python3 benchmarks/traffic.py --model wav2vec2 --size full --range 1600:160000 --precision fp16 \
    --ideal-lengths 8 --requests 1000 --only-peers --peer-requests 200 --peers padded,compile,torch --out $OUT/w2v-peers \
    > $OUT/w2v-peers.log 2>&1
echo "peers rc $?"; tail -n 20 $OUT/w2v-peers.log
