# calls 3, 4 and 5 (part_ab, part_ac, part_ad): the bundle's next part
bash benchmarks/results/2026-11-28-h200-w2v-rows/ship.sh $1
