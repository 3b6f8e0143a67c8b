# call 8: the PyTorch peers on the first 300 requests of each traffic
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 580 python3 benchmarks/traffic.py --model wav2vec2 --size full --range 1600:160000 --precision fp16 \
    --ideal-lengths 8 --requests 1000 --only-peers --peer-requests 300 --peers torch,compile,padded --out $OUT > $OUT/traffic-peers.log 2>&1
echo "peers rc $?"; tail -n 30 $OUT/traffic-peers.log
