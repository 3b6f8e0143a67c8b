# One model a call (MODEL = gpt2 or bert), its steps one after another (session 56's call D ran four compiles
# at once on the 16 cores and none finished). Build, compile the range, compile the 8 single-length bundles,
# then one process times grapec's rows, the ideal and the PyTorch peers (their first 100 requests of each
# traffic) and checks 8 random lengths against onnxruntime. SLIM=1 leaves out the ideal (measured before).
# Usage: [SLIM=1] bash traffic.sh MODEL [EXTRA ARGS]
START=$(date +%s); left() { echo $(( ${BUDGET:-590} - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
m=$1; shift
W="--model $m --size full --range 1:512 --precision fp16 --ideal-lengths 8 --requests 1000 $*"
[ -n "$SLIM" ] && W="$W --no-ideal"
python3 models/build.py --size full --out models/full $m > $OUT/$m-build.log 2>&1; echo "built rc $? ($(left) s left)"
timeout 220 python3 benchmarks/traffic.py $W --compile-only --no-ideal > $OUT/$m-compile.log 2>&1; echo "range rc $? ($(left) s left)"
[ -z "$SLIM" ] && { timeout 100 python3 benchmarks/traffic.py $W --singles-only > $OUT/$m-singles.log 2>&1; echo "singles rc $? ($(left) s left)"; }
timeout $(( $(left) - 5 )) python3 benchmarks/traffic.py $W --check 8 --peers torch,compile,padded --peer-requests 100 \
    --out $OUT/$m > $OUT/$m-traffic.log 2>&1; echo "traffic rc $? ($(left) s left)"
grep -E "check:|torch:" $OUT/$m-traffic.log | tail -12
grep -E "^\| " $OUT/$m/traffic.md | tail -n +3
