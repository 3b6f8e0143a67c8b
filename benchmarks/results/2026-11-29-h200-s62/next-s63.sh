# Written in session 62, not yet run: the two branches of session 62 against main, each side in its own root.
# Before the calls, on main:
#   rm -rf .ab && mkdir -p .ab/main .ab/onetile16 && git archive main src | tar -x -C .ab/main
#   git archive wip/one-tile-at-16 src | tar -x -C .ab/onetile16
#   for s in loop:wip/loop-body-branches prefetch:wip/gemv-weights-before-wait; do
#     mkdir -p .ab/${s%%:*} && git archive ${s#*:} src tests | tar -x -C .ab/${s%%:*}; done
# (.ab is about 9 MB: with the tree and the llama mode's wheels, just under the 64 MiB a call carries)
# Then, back to back while the machine is warm (carry .ab and the wheels each mode names):
#   bash next-s63.sh tests     nvmath, cudnn frontend: each branch's GPU tests for what it touched (loop: the Loop
#                              body's schedule, the workspaces by branch, the loop profile; prefetch: the GEMVs;
#                              onetile16: the small GEMMs)
#   bash next-s63.sh llama     + onnx_ir, onnxscript, ml_dtypes, onnxruntime_genai: the Llama-1B-shaped builder
#                              export, fp16 and int4, batch 1, 4 and 16, on the three sides; then the loop body
#                              profiled on main at batch 1, fp16 (--loop-steps)
#   bash next-s63.sh rows16    (after llama, which builds the fp16 model) nvmath, cudnn: fp16 at batch 1, 4 and 16 on
#                              main and wip/one-tile-at-16 (half weights at 9-16 rows in the one-tile form), each
#                              batch also in a bundle of its own (--bundle-per-batch)
#   bash next-s63.sh build     .whl/optimum + nvmath, cudnn: GPT-J-6B's checkpoint and optimum export (about 290 s)
#   bash next-s63.sh gptj      nvmath, cudnn: GPT-J-6B's generation on main and loop, batch 1; the loop body
#                              profiled on each
# Session 62 (main): Llama fp16 0.962 / 1.351 / 1.781 ms/token, int4 0.789 / 1.133 / 1.644 (call 3), GPT-J 4.116 (70%).
START=$(date +%s); left() { echo $(( 585 - ($(date +%s) - START) )); }
[ "$1" = build ] && exec bash benchmarks/results/2026-11-29-h200-s59/next-gptj.sh build
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
for side in main loop prefetch onetile16; do
    rm -rf /tmp/root-$side && mkdir /tmp/root-$side && ln -s $PWD/.ab/$side/src /tmp/root-$side/src
    if [ -d .ab/$side/tests ]; then ln -s $PWD/.ab/$side/tests /tmp/root-$side/tests; else ln -s $PWD/tests /tmp/root-$side/tests; fi
    for d in benchmarks models pyproject.toml; do ln -s $PWD/$d /tmp/root-$side/$d; done
done
on_side() {   # side, log, command...: the command in the side's root, its src first on the path
    local side=$1 log=$2; shift 2
    (cd /tmp/root-$side && PYTHONPATH=/tmp/site:/tmp/root-$side/src:tests:models:benchmarks timeout $(( $(left) - 10 )) "$@") \
        > $OUT/$log 2>&1; echo "$log rc $? ($(left) s left)"
}
if [ "$1" = tests ]; then
    on_side loop tests-loop.log python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_decoder_generation.py \
        tests/test_gpu_streams.py tests/test_threads.py tests/test_genai_models.py
    on_side prefetch tests-prefetch.log python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_gemv.py \
        tests/test_gpu.py tests/test_matmul_nbits.py
    on_side onetile16 tests-onetile16.log python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_small_gemm.py
    for f in $OUT/tests-*.log; do echo "== $(basename $f)"; tail -n 1 $f; grep -E "^FAILED" $f | cut -c1-200; done
fi
if [ "$1" = llama ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/onnx_ir*.whl .whl/onnxscript*.whl \
        .whl/ml_dtypes*.whl .whl/onnxruntime_genai*.whl 2>/dev/null
    for precision in fp16 int4; do
        ONNX=/tmp/llm/llama1b_$precision/model.onnx
        [ -f $ONNX ] || timeout 100 python3 models/llm.py llama1b --out /tmp/llm --precision $precision \
            --builder-dir /tmp/site/onnxruntime_genai/models >> $OUT/build.log 2>&1
        for side in loop prefetch main; do
            on_side $side $precision-$side.log python3 benchmarks/llm.py --model $ONNX --batch 1 4 16 --prompt 128 \
                --new 256 --prefill 0 --peers none --iterations 3
        done
    done
    for f in $OUT/fp16-*.log $OUT/int4-*.log; do echo "== $(basename $f)"; grep -E "^\| (1|4|16) " $f | cut -c1-40; done
    [ $(left) -gt 60 ] && on_side main loop-steps.log python3 benchmarks/llm.py --model /tmp/llm/llama1b_fp16/model.onnx \
        --loop-steps --prompt 128 --new 256
    grep -A8 "loop body" $OUT/loop-steps.log | cut -c1-150
fi
if [ "$1" = rows16 ]; then
    for side in onetile16 main; do
        on_side $side rows16-$side.log python3 benchmarks/llm.py --model /tmp/llm/llama1b_fp16/model.onnx --batch 1 4 16 \
            --prompt 128 --new 256 --prefill 0 --peers none --iterations 3 --bundle-per-batch
        grep -E "^\| (1|4|16) |own" $OUT/rows16-$side.log | cut -c1-100
    done
fi
if [ "$1" = gptj ]; then
    ONNX=/tmp/llm/gptj6b_optimum_fp16/model.onnx
    for side in loop main; do
        on_side $side gptj-$side.log python3 benchmarks/llm.py --model $ONNX --batch 1 --prompt 128 --new 256 --prefill 0 \
            --peers none --iterations 3
        grep -E "^\| 1 " $OUT/gptj-$side.log | cut -c1-80
    done
    for side in loop main; do
        [ $(left) -gt 90 ] && on_side $side loop-steps-$side.log python3 benchmarks/llm.py --model $ONNX --loop-steps \
            --prompt 128 --new 256
        grep -A6 "loop body" $OUT/loop-steps-$side.log | cut -c1-150
    done
fi
