#!/usr/bin/env bash
# The GPU check of issue 17, on a machine with one GPU, in under 10 minutes: the GPU tests, the
# engine against one raw NCCL allreduce (ResNet-101's gradient bucket), and training throughput
# of hvdtrain at world size 1 through NCCL against a plain PyTorch loop (ResNet-50, AMP, batch
# 64), in alternating rounds, with hvdtrain's gradients in segments (the default) and one by one
# (HVDTRAIN_SEGMENT_BYTES=0, as before segments). Prints a summary; the details are under $OUT
# (default gpu_check/).
#
#     bash scripts/gpu_check.sh            # sets up .venv first, as `make test` does
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
make --quiet .venv/.installed-stamp >/dev/null || exit 1
PY=.venv/bin/python
export PYTHONUNBUFFERED=1

{ nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"; } | tee "$OUT/gpu.txt"
$PY -c "import hvdtrain.torch as hvd, torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'GPUs', torch.cuda.device_count(), '| nccl_built', hvd.nccl_built(), 'cuda_built', hvd.cuda_built())" \
    | tee -a "$OUT/gpu.txt"

$PY -m pytest -q -rs tests/gpu tests/core/test_core_gpu_path.py > "$OUT/tests.txt" 2>&1
tests_rc=$?
tests_line=$(tail -1 "$OUT/tests.txt")

$PY scripts/bench_allreduce.py --device cuda --rounds 5 --json "$OUT/allreduce.json" > "$OUT/allreduce.txt" 2>&1
allreduce_rc=$?

# Throughput, img/s: the plain loop and hvdtrain in turns, a ratio within each round.
bench() {
    $PY scripts/synthetic_benchmark.py --model resnet50 --amp --batch-size 64 --num-iters 5 "$@" 2>&1 \
        | tee -a "$OUT/training.txt" | sed -n 's/^Total img\/sec on 1 GPU(s): \([0-9.]*\).*/\1/p'
}
ratio() { $PY -c "print(round($1 / $2, 3))" 2>/dev/null || echo nan; }
median() { $PY -c "import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))" "$@" 2>/dev/null || echo nan; }
ratios=()
per_gradient_ratios=()
for round in $(seq "$ROUNDS"); do
    plain=$(bench --plain)
    engine=$(HVDTRAIN_REDUCE_ALONE=1 bench)
    per_gradient=$(HVDTRAIN_REDUCE_ALONE=1 HVDTRAIN_SEGMENT_BYTES=0 bench)
    echo "round $round: plain $plain img/s, hvdtrain $engine img/s, hvdtrain per gradient $per_gradient img/s" \
        | tee -a "$OUT/training.txt"
    ratios+=("$(ratio "$engine" "$plain")")
    per_gradient_ratios+=("$(ratio "$per_gradient" "$plain")")
done

echo
echo "== GPU check summary =="
cat "$OUT/gpu.txt"
echo "tests: $tests_line (exit $tests_rc; $OUT/tests.txt)"
if [ $allreduce_rc -eq 0 ]; then
    grep -E "raw NCCL|engine," "$OUT/allreduce.txt"
else
    echo "bench_allreduce --device cuda failed (exit $allreduce_rc): $(tail -3 "$OUT/allreduce.txt")"
fi
echo "training, ResNet-50 AMP batch 64, hvdtrain (NCCL, world size 1) / plain PyTorch: median $(median "${ratios[@]}")" \
     "(rounds: ${ratios[*]}; goal >= 0.98)"
echo "  the same, gradients submitted one by one (HVDTRAIN_SEGMENT_BYTES=0): median $(median "${per_gradient_ratios[@]}")" \
     "(rounds: ${per_gradient_ratios[*]})"
[ $tests_rc -eq 0 ] && [ $allreduce_rc -eq 0 ]
