# cycle 2 (the machine was given back after call 7 and its files with it), call 1 (the wheels): the ONNX file and
# the 8 single-length bundles of the ideal, again
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
R=out/bench/traffic-bundles/wav2vec2-fp16-samples1600-160000.grape
[ -s $R ] || touch $R
timeout 420 python3 benchmarks/traffic.py --model wav2vec2 --size full --range 1600:160000 --precision fp16 \
    --ideal-lengths 8 --requests 300 --compile-only > $OUT/singles-compile-2.log 2>&1
echo "singles rc $?"; ls out/bench/traffic-bundles/ | wc -l; ls -l models/full/
