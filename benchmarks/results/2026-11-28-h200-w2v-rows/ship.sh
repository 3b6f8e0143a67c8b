# the range bundle, compiled on the CPU machine, carried in parts (a call carries at most 64 MiB): one part a call,
# appended on the warm device machine; usage: bash ship.sh PART
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/ship && cat .ship/$1 >> /tmp/ship/w2v.grape && ls -l /tmp/ship/w2v.grape
