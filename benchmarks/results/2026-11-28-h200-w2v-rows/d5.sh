# call 6 (part_ae): the bundle whole (sha256 checked), cached for traffic.py; its load timed and 16 lengths checked
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
D=benchmarks/results/2026-11-28-h200-w2v-rows
bash $D/ship.sh part_ae
echo "bundle sha256 $(sha256sum /tmp/ship/w2v.grape | cut -c1-16) (want $(cut -c1-16 $D/bundle.sha256))"
cp /tmp/ship/w2v.grape out/bench/traffic-bundles/wav2vec2-fp16-samples1600-160000.grape
timeout 560 python3 $D/load_check.py /tmp/ship/w2v.grape models/full/wav2vec2.onnx > $OUT/load-check.log 2>&1
echo "load check rc $?"; grep -v "^  built" $OUT/load-check.log | tail -n 22
