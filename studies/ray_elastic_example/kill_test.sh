#!/bin/bash
# Runs example.py in DIR with ARGS, SIGKILLs one rank's process once its output (DIR/runkill.log)
# shows PATTERN, and prints the run's exit status.
#   pytorch_ray_elastic.py: kill_test.sh /tmp/rayex "Train Epoch: 4" --data-dir /tmp/rayex/data --epochs 10
#   basic_ray_elastic.py:   kill_test.sh /tmp/rayex2 " 60/94 " --data-dir /tmp/rayex2/data --epochs 3 --log-dir /tmp/rayex2/logs
# (batch 60 of epoch 1 there: after its commit at batch 50, and before its first checkpoint file,
# which the restarted function would load with torch.load, whose weights_only default since
# PyTorch 2.6 refuses the NumPy scalars of the example's scheduler state)
dir=$1 pattern=$2
shift 2
cd "$dir" || exit 1
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PATH=/work/main/.venv/bin:$PATH
rm -f runkill.log checkpoint-*.pth.tar
timeout 900 python example.py "$@" > runkill.log 2>&1 &
pid=$!
for i in $(seq 9000); do grep -aq -- "$pattern" runkill.log 2>/dev/null && break; sleep 0.1; done
victim=$(pgrep -f "hvdtrain.launch.relay rank" | tail -1)
echo "killing rank process $victim"
kill -9 "$victim"
wait $pid
echo "exit $?"
