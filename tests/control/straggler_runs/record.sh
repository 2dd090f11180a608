#!/bin/bash
# How the runs in this folder were recorded (root; a cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu):
#   tests/control/straggler_runs/record.sh QUOTA OUT SHARDS
# The built-in trainer, 2 torchrun nodes on localhost (node 0 on CPU 0, node 1 on CPU 1), node 1 in a cpu
# cgroup at QUOTA % of one core. slow/: QUOTA 5 (rank 1 computes ~3.5x rank 0's time); even/: QUOTA 200
# (no limit). SHARDS: trainer.data.shards.prepare(512 docs, 16 rows per group, 8 groups per shard, seed 0).
# Each node's out/ was copied to <case>/node<R>/out/ as playbooks/collect_logs.yml lays a run out.
set -e
QUOTA=$1; OUT=$2; SHARDS=$3
cd "$(dirname "$0")/../../.."
CG=/sys/fs/cgroup/cpu/ddplab-straggler
mkdir -p $CG; echo 100000 > $CG/cpu.cfs_period_us; echo $((QUOTA*1000)) > $CG/cpu.cfs_quota_us
PORT=$(.venv/bin/python -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
ARGS="--data $SHARDS --out $OUT --depth 2 --seq-len 64 --batch-size 8 --threads 1 --steps 20 --log-every 10"
ARGS="$ARGS --straggler-every 0"
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
L="--nnodes=2 --nproc-per-node=1 --master-addr=127.0.0.1 --master-port=$PORT --rdzv-conf=timeout=60"
taskset -c 0 .venv/bin/python -m torch.distributed.run $L --node-rank=0 -m trainer $ARGS > $OUT.n0.log 2>&1 &
P0=$!
bash -c "echo \$\$ > $CG/cgroup.procs; exec taskset -c 1 .venv/bin/python -m torch.distributed.run $L \
  --node-rank=1 -m trainer $ARGS" > $OUT.n1.log 2>&1
wait $P0
rmdir $CG
