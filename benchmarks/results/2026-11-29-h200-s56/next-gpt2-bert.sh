# One model a call (MODEL = gpt2 or bert), its steps one after another: call D of session 56 ran four compiles at
# once on the 16 cores and none finished in 220 s. Session 53 compiled GPT-2's range alone in 108 s.
# First grapec's rows and the ideal alone (with 8 lengths checked against onnxruntime), then the same traffic
# again with the PyTorch peers in the same process (their first 100 requests of each traffic), with what is left.
# Usage: bash next-gpt2-bert.sh MODEL
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
m=$1; W="--model $m --size full --range 1:512 --precision fp16 --ideal-lengths 8 --requests 1000"
python3 models/build.py --size full --out models/full $m > $OUT/$m-build.log 2>&1; echo "built rc $? at $(( 585 - $(left) )) s"
timeout 200 python3 benchmarks/traffic.py $W --compile-only --no-ideal > $OUT/$m-compile.log 2>&1; echo "range rc $? ($(left) s left)"
timeout 120 python3 benchmarks/traffic.py $W --singles-only > $OUT/$m-singles.log 2>&1; echo "singles rc $? ($(left) s left)"
T=$(( $(left) - 240 )); [ $T -gt 120 ] && T=120
timeout $T python3 benchmarks/traffic.py $W --peers "" --check 8 --out $OUT/$m > $OUT/$m-traffic.log 2>&1; echo "traffic rc $? ($(left) s left)"
T=$(( $(left) - 5 ))
timeout $T python3 benchmarks/traffic.py $W --peers torch,compile,padded --peer-requests 100 --out $OUT/$m-all \
    > $OUT/$m-all.log 2>&1; echo "with peers rc $? ($(left) s left)"
grep -E "^\| (grapec range|ideal)" $OUT/$m/traffic.md; grep -E "^\| " $OUT/$m-all/traffic.md | tail -n +3
