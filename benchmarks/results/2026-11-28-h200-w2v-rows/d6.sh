# call 7: the traffic, grapec's rows and the ideal
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 580 python3 benchmarks/traffic.py --model wav2vec2 --size full --range 1600:160000 --precision fp16 \
    --ideal-lengths 8 --requests 1000 --peers "" --out $OUT > $OUT/traffic-grapec.log 2>&1
echo "traffic rc $?"; grep -v "graphs built" $OUT/traffic-grapec.log | tail -n 30
