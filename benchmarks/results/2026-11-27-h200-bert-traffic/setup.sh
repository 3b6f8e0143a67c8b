# sourced at the start of every device call: wheels, paths, the bundles' cache
[ -d /tmp/site/nvmath ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/nvmath*.whl .whl/nvidia_cudnn*.whl
export PYTHONPATH=/tmp/site:src:tests:models:benchmarks
mkdir -p out/bench/traffic-bundles
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
