#!/bin/bash
cd /tmp/rayex
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PATH=/work/main/.venv/bin:$PATH
rm -f runkill.log
timeout 900 python example.py --data-dir /tmp/rayex/data --epochs 10 > runkill.log 2>&1 &
pid=$!
for i in $(seq 900); do grep -aq "Train Epoch: 4" runkill.log 2>/dev/null && break; sleep 0.1; done
victim=$(pgrep -f "hvdtrain.launch.relay rank" | tail -1)
echo "killing rank process $victim"
kill -9 "$victim"
wait $pid
echo "exit $?"
grep -a -i "test set\|hvdtrain\|lost its" runkill.log | cut -c1-220 | head -20
grep -a "Train Epoch" runkill.log | awk '{print $3}' | uniq -c | tr '\n' ' '
