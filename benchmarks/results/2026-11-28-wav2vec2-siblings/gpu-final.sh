# the session's last call: the family-exec GPU tests after the sibling fix and FAMILY_EXEC_MIN 256 (tiny Wav2Vec2
# ranges against onnxruntime, the 2-D GPT-2 family, the sibling nodes)
. benchmarks/results/2026-11-27-h200-bert-traffic/setup.sh
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_family_exec.py -rA > $OUT/family-tests.log 2>&1
echo "family tests rc $?"; grep -E "^(PASSED|FAILED|ERROR)|^E  .*Error|passed|failed" $OUT/family-tests.log | tail -n 12
