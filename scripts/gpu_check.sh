#!/usr/bin/env bash
# The GPU check of issue 17, on a machine with one GPU. Its parts, in PARTS (default: all five,
# about 10 minutes on an H100; a device session that has less runs the parts it needs most):
#   tests     tests/gpu and the GPU path's tests;
#   allreduce the engine against one raw NCCL allreduce of ResNet-101's gradient bucket;
#   training  throughput of hvdtrain at world size 1 through NCCL against a plain PyTorch loop
#             (ResNet-50, AMP, batch 64), in alternating rounds, with hvdtrain's gradients in
#             segments (the default) and one by one (HVDTRAIN_SEGMENT_BYTES=0, as before segments);
#   overhead  what the optimizer costs the training thread a step, on 320 small gradients
#             (scripts/bench_optimizer_overhead.py --device cuda, seconds);
#   profile   a few steps of each loop under torch.profiler: traces, operator tables and how much
#             of the time the GPU was busy, to study offline where hvdtrain's steps lose time.
# Prints a summary; the details are under $OUT (default gpu_check/).
#
#     bash scripts/gpu_check.sh                       # sets up .venv first, as `make test` does
#     PARTS="training profile" ROUNDS=2 bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check}
ROUNDS=${ROUNDS:-3}
PARTS=${PARTS:-tests allreduce training overhead profile}
mkdir -p "$OUT"
make --quiet .venv/.installed-stamp >/dev/null || exit 1
PY=.venv/bin/python
export PYTHONUNBUFFERED=1
wanted() { [[ " $PARTS " == *" $1 "* ]]; }

{ nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"; } | tee "$OUT/gpu.txt"
$PY -c "import hvdtrain.torch as hvd, torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'GPUs', torch.cuda.device_count(), '| nccl_built', hvd.nccl_built(), 'cuda_built', hvd.cuda_built())" \
    | tee -a "$OUT/gpu.txt"
summary=()
failed=0

if wanted tests; then
    $PY -m pytest -q -rs tests/gpu tests/single/core/test_cuda.py tests/single/core/test_nccl_backend.py \
        tests/parallel/core/test_cuda.py tests/parallel/core/test_nccl_backend.py > "$OUT/tests.txt" 2>&1 || failed=1
    summary+=("tests: $(tail -1 "$OUT/tests.txt") ($OUT/tests.txt)")
fi

if wanted allreduce; then
    if $PY scripts/bench_allreduce.py --device cuda --rounds 5 --json "$OUT/allreduce.json" > "$OUT/allreduce.txt" 2>&1
    then
        summary+=("$(grep -E "raw NCCL|engine," "$OUT/allreduce.txt")")
    else
        failed=1
        summary+=("bench_allreduce --device cuda failed: $(tail -3 "$OUT/allreduce.txt")")
    fi
fi

# Throughput, img/s: the plain loop and hvdtrain in turns, a ratio within each round. hvdtrain runs
# with HOROVOD_ELASTIC=1: at world size 1 the DistributedOptimizer, like Horovod's, reduces only in
# an elastic job (whose world may grow), and the point here is to measure its reductions.
bench() {
    $PY scripts/synthetic_benchmark.py --model resnet50 --amp --batch-size 64 --num-iters 5 "$@" 2>&1 \
        | tee -a "$OUT/training.txt" | sed -n 's/^Total img\/sec on 1 GPU(s): \([0-9.]*\).*/\1/p'
}
ratio() { $PY -c "print(round($1 / $2, 3))" 2>/dev/null || echo nan; }
median() { $PY -c "import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))" "$@" 2>/dev/null || echo nan; }

if wanted training; then
    ratios=()
    per_gradient_ratios=()
    for round in $(seq "$ROUNDS"); do
        plain=$(bench --plain)
        engine=$(HOROVOD_ELASTIC=1 bench)
        per_gradient=$(HOROVOD_ELASTIC=1 HVDTRAIN_SEGMENT_BYTES=0 bench)
        echo "round $round: plain $plain img/s, hvdtrain $engine img/s, hvdtrain per gradient $per_gradient img/s" \
            | tee -a "$OUT/training.txt"
        ratios+=("$(ratio "$engine" "$plain")")
        per_gradient_ratios+=("$(ratio "$per_gradient" "$plain")")
    done
    summary+=("training, ResNet-50 AMP batch 64, hvdtrain (NCCL, world size 1) / plain PyTorch: median \
$(median "${ratios[@]}") (rounds: ${ratios[*]}; goal >= 0.98)")
    summary+=("  the same, gradients submitted one by one (HVDTRAIN_SEGMENT_BYTES=0): median \
$(median "${per_gradient_ratios[@]}") (rounds: ${per_gradient_ratios[*]})")
fi

if wanted overhead; then
    if $PY scripts/bench_optimizer_overhead.py --device cuda > "$OUT/overhead.txt" 2>&1; then
        summary+=("optimizer overhead on the training thread: $(tail -1 "$OUT/overhead.txt")")
    else
        failed=1
        summary+=("bench_optimizer_overhead --device cuda failed: $(tail -3 "$OUT/overhead.txt")")
    fi
fi

if wanted profile; then
    for loop in plain hvdtrain; do
        if [ $loop = plain ]; then flags=(--plain); else flags=(); fi
        HOROVOD_ELASTIC=1 $PY scripts/synthetic_benchmark.py --model resnet50 --amp --batch-size 64 \
            --num-warmup-batches 10 --num-iters 1 "${flags[@]}" --profile "$OUT/profile-$loop" \
            > "$OUT/profile-$loop.txt" 2>&1 || failed=1
        summary+=("profile, $loop: $(grep -E "^Profile of" "$OUT/profile-$loop.txt" || tail -1 "$OUT/profile-$loop.txt")")
    done
fi

echo
echo "== GPU check summary (parts: $PARTS) =="
cat "$OUT/gpu.txt"
printf '%s\n' "${summary[@]}"
exit $failed
