#!/bin/bash
# Ansible managed
# Rank 0 of run eager-all-r1 on node0; started in tmux by
# roles/launch. Output goes to the pane and to the run folder's launch.log; the exit code to exit_code.
# The ranks run in /root/ddplab/code/user (ddplab_workdir).
set -u
run_dir=/root/ddplab/runs/eager-all-r1
cd "$run_dir"
set -a
# shellcheck source=/dev/null
. ./trainer.env
set +a
export OMP_NUM_THREADS=$DDPLAB_THREADS MKL_NUM_THREADS=$DDPLAB_THREADS
rm -f exit_code stopped
echo "ddplab: run $DDPLAB_RUN_ID rank $NODE_RANK/$NNODES on $(hostname) master $MASTER_ADDR:$MASTER_PORT" \
  "iface ${GLOO_SOCKET_IFNAME:-unset} threads $DDPLAB_THREADS" | tee -a launch.log
# Keep the node awake while the rank runs, where the OS offers it (systemd-inhibit needs logind).
inhibit=()
if command -v systemd-inhibit >/dev/null 2>&1 \
    && systemd-inhibit --what=sleep:idle --who=ddplab --why=probe true >/dev/null 2>&1; then
  inhibit=(systemd-inhibit --what=sleep:idle --who=ddplab --mode=block --why="ddplab run $DDPLAB_RUN_ID rank $NODE_RANK")
  echo "ddplab: keeping $(hostname) awake while the rank runs (systemd-inhibit --what=sleep:idle)" | tee -a launch.log
else
  echo "ddplab: note: no working systemd-inhibit on $(hostname); nothing keeps it from sleeping during the run" \
    | tee -a launch.log
fi
set -o pipefail
cd /root/ddplab/code/user
"${inhibit[@]}" /root/ddplab/venv-code/bin/python -m torch.distributed.run --nproc-per-node "$NPROC_PER_NODE" \
  --nnodes "$NNODES" --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
  --rdzv-conf timeout=60 --max-restarts 0 \
  -m scripts.base_train --device-type=cpu --depth=4 --max-seq-len=512 --window-pattern=L --device-batch-size=1 --total-batch-size=1024 --num-iterations=20 --eval-every=10 --eval-tokens=8192 --core-metric-every=-1 \
  2>&1 | tee -a "$run_dir/launch.log"
code=${PIPESTATUS[0]}
echo "ddplab: rank $NODE_RANK exited with code $code" | tee -a "$run_dir/launch.log"
echo "$code" > "$run_dir/exit_code.tmp" && mv "$run_dir/exit_code.tmp" "$run_dir/exit_code"
exit "$code"
