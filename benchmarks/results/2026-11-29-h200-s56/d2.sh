# Call B, right after call A on the same warm machine (its bundles): the PyTorch peers on the first 200 requests of
# each traffic (same lengths and seeds), then grapec bench at one family size, its nodes.
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
C=out/bench/traffic-bundles
W="--model wav2vec2 --size full --range 1600:160000 --precision fp16 --ideal-lengths 8 --requests 2000"
ls $C | head -12
timeout 480 python3 benchmarks/traffic.py $W --only-peers --peer-requests 200 --out $OUT/w2v-peers > $OUT/w2v-peers.log 2>&1
echo "peers rc $? ($(left) s left)"
T=$(( $(left) - 5 )); [ $T -gt 10 ] && timeout $T python3 -c "from grapec.tools.cli import main; main()" bench \
    $C/wav2vec2-fp16-samples1600-160000.grape --dim batch=1,samples=24229 --per-step 8 > $OUT/bench-24229.log 2>&1
echo "bench rc $?"; tail -n 12 $OUT/bench-24229.log; grep -E "^\|" $OUT/w2v-peers/traffic.md | head -14
