# Session 60, first call: the GPU test of bbe17de (packed codes widen a float32 A's step) and every MatMulNBits GPU
# test, then s59's norm-into-GEMV A/B (main from .ab/src, the branch from this tree). Carry .whl and .ab.
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_matmul_nbits.py > $OUT/nbits.log 2>&1
echo "matmul_nbits gpu rc $?"; tail -n 3 $OUT/nbits.log
bash benchmarks/results/2026-11-29-h200-s59/next-norm-gemv.sh
