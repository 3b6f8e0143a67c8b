# call 1: the family-exec GPU tests, then the GPU tests of the shared execs' way (the hooks they share changed)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 300 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_gpu_family_exec.py > $OUT/family-tests.log 2>&1
echo "family tests rc $?"; tail -30 $OUT/family-tests.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_dynamic.py tests/test_gpu_iobinding.py > $OUT/dynamic-tests.log 2>&1
echo "dynamic tests rc $?"; tail -5 $OUT/dynamic-tests.log
