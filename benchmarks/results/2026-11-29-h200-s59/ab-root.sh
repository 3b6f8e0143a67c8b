# Sourced by this folder's A/B calls. benchmarks/llm.py puts its own ROOT/src first on sys.path, so main's side runs
# from /tmp/abroot, a root whose src is .ab/src; `use_side NAME` sets ROOTDIR and PYTHONPATH for a side ("main":
# that root; any other name: this tree). DIMS: the Llama-shaped decode step alone at past 384.
rm -rf /tmp/abroot && mkdir /tmp/abroot && ln -s $PWD/.ab/src /tmp/abroot/src
for d in benchmarks models tests; do ln -s $PWD/$d /tmp/abroot/$d; done
DIMS=batch_size=1,sequence_length=1,past_sequence_length=384,total_sequence_length=384,kv_cache_dim=64
use_side() { ROOTDIR=$PWD; [ "$1" = main ] && ROOTDIR=/tmp/abroot; export PYTHONPATH=/tmp/site:$ROOTDIR/src:tests:models:benchmarks; }
