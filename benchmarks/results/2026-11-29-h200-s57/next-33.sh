# What issue 33 still needs on the GPU: 16 random lengths against onnxruntime for GPT-2 and BERT at this code, and
# the full-size GPU tests. Usage: bash next-33.sh "gpt2 bert"|full   (one a call; each fits in 600 s)
# The models named run side by side: each range compile is mostly single-threaded and the machine has 16 cores.
START=$(date +%s); left() { echo $(( ${BUDGET:-590} - ($(date +%s) - START) )); }
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
if [ "$1" = full ]; then
    timeout $(( $(left) - 5 )) python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 -rs tests/test_gpu_full.py \
        > $OUT/gpu-full.log 2>&1; echo "test_gpu_full rc $?"; tail -5 $OUT/gpu-full.log; exit
fi
one() {
    m=$1
    python3 models/build.py --size full --out models/full $m > $OUT/$m-build.log 2>&1; echo "$m built rc $? ($(left) s left)"
    timeout $(( $(left) - 5 )) python3 benchmarks/traffic.py --model $m --size full --range 1:512 --precision fp16 \
        --requests 200 --no-ideal --peers "" --check 16 --out $OUT/$m > $OUT/$m-check.log 2>&1
    echo "$m check rc $? ($(left) s left)"
}
for m in $1; do one $m & done; wait
for m in $1; do
    echo "== $m"; grep -E "check:" $OUT/$m-check.log | cut -c1-200; tail -3 $OUT/$m-check.log | cut -c1-300
done
