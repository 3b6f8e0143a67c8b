# cycle 2, the last call: the traffic (300 requests), grapec's rows and the ideal; a request over 100 ms is named
# as it happens, and every thread's stack is dumped every 60 s (call 7 of cycle 1 printed nothing for 500 s after
# its graphs were built)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
cp /tmp/ship/w2v.grape out/bench/traffic-bundles/wav2vec2-fp16-samples1600-160000.grape
timeout 560 python3 -c "
import faulthandler, runpy, sys
faulthandler.dump_traceback_later(60, repeat=True, file=open('$OUT/stacks.txt', 'w'))
sys.argv = ['benchmarks/traffic.py', '--model', 'wav2vec2', '--size', 'full', '--range', '1600:160000', '--precision', 'fp16',
            '--ideal-lengths', '8', '--requests', '300', '--peers', '', '--out', '$OUT']
runpy.run_path('benchmarks/traffic.py', run_name='__main__')" > $OUT/traffic-grapec.log 2>&1
echo "traffic rc $?"; grep -v "graphs built" $OUT/traffic-grapec.log | tail -n 40
grep -B2 -A14 "most recent call first" $OUT/stacks.txt | grep -E "File|Thread" | head -n 30
