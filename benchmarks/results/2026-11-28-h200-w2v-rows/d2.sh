# call 2 (part_aa): the family-exec GPU tests (tiny Wav2Vec2 ranges, the 2-D GPT-2 family, sibling nodes), while
# the 8 single-length bundles of the traffic's ideal compile (the range's cache entry a placeholder meanwhile)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
D=benchmarks/results/2026-11-28-h200-w2v-rows
bash $D/ship.sh part_aa
R=out/bench/traffic-bundles/wav2vec2-fp16-samples1600-160000.grape
[ -s $R ] || touch $R
( timeout 400 python3 benchmarks/traffic.py --model wav2vec2 --size full --range 1600:160000 --precision fp16 \
    --ideal-lengths 8 --requests 2000 --compile-only > $OUT/singles-compile.log 2>&1; echo "singles rc $?" >> $OUT/singles-compile.log ) &
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_family_exec.py -rA > $OUT/family-tests.log 2>&1
echo "family tests rc $?"; grep -E "^(FAILED|ERROR)|^E  .*Error|passed|failed" $OUT/family-tests.log | tail -n 12
wait; tail -n 3 $OUT/singles-compile.log; ls -l out/bench/traffic-bundles/
