# Call D: GPT-2 and BERT (full, fp16, seq 1..512) at this session's code: each range compiled beside its 8 singles
# (all four at once), then each traffic's grapec and ideal rows (1000 requests a traffic), then each model's
# PyTorch peers on the first 100 requests of each traffic, in a process of their own. Every step time-boxed.
START=$(date +%s); left() { echo $(( 500 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
W="--range 1:512 --precision fp16 --ideal-lengths 8 --requests 1000"
for m in gpt2 bert; do python3 models/build.py --size full --out models/full $m > $OUT/$m-build.log 2>&1 & done; wait
echo "built at $(( $(date +%s) - START )) s"
for m in gpt2 bert; do
  ( timeout 220 python3 benchmarks/traffic.py --model $m --size full $W --compile-only --no-ideal > $OUT/$m-compile.log 2>&1
    echo "$m range rc $? at $(( $(date +%s) - START )) s" ) &
  ( timeout 220 python3 benchmarks/traffic.py --model $m --size full $W --singles-only > $OUT/$m-singles.log 2>&1
    echo "$m singles rc $?" ) &
done; wait
for m in gpt2 bert; do
  T=$(( ($(left) - 60) / 2 )); [ $T -gt 110 ] && T=110
  timeout $T python3 benchmarks/traffic.py --model $m --size full $W --peers "" --out $OUT/$m > $OUT/$m-traffic.log 2>&1
  echo "$m traffic rc $? ($(left) s left)"
done
for m in gpt2 bert; do
  T=$(( ($(left) - 5) / 2 )); [ $m = bert ] && T=$(( $(left) - 5 ))
  timeout $T python3 benchmarks/traffic.py --model $m --size full $W --only-peers --peer-requests 100 \
      --out $OUT/$m-peers > $OUT/$m-peers.log 2>&1; echo "$m peers rc $? ($(left) s left)"
done
for m in gpt2 bert; do grep -E "^\| (grapec range|ideal)" $OUT/$m/traffic.md; grep -E "^\| (torch|padded)" $OUT/$m-peers/traffic.md; done
