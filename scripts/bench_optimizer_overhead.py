"""What hvdtrain.torch's DistributedOptimizer costs the training thread a step, against plain
torch.optim on the same model (and, with --ddp, against PyTorch DDP): the price a host-bound GPU
loop pays in full.

    python scripts/bench_optimizer_overhead.py [--layers 160] [--device cpu|cuda] [--rounds 7] [--ddp]
    python scripts/bench_optimizer_overhead.py --device cuda --model resnet50 --batch-size 64 --amp --ddp

One process, with HOROVOD_ELASTIC=1: Horovod's DistributedOptimizer reduces nothing in a job of
one rank unless the job is elastic (its world may grow), so this marks the job elastic to have
the gradients go through the engine, as gpu_check.sh's hvdtrain runs do. By default the model has
--layers Linear(16, 16) layers (two gradient tensors each, so that the cost per tensor dominates,
not arithmetic). With --model, a torchvision model of that name trains on one synthetic batch of
--batch-size images, under bf16 autocast on CUDA (as train.autocast=bf16), or with --amp under
fp16 autocast with a GradScaler, in Horovod's pattern for hvdtrain (synchronize, unscale, step in
skip_synchronize), as synthetic_benchmark.py --amp trains: the training loop of a real model, where
timing the loops in the same process, in turn, leaves out what differs from one process to the
next (the GPU's clocks, where the threads land), which separate runs of each loop cannot.
--ddp adds a third copy of the model wrapped in DistributedDataParallel, in a process group of
this one process (NCCL on a GPU, gloo on the CPU), which reduces its gradients at world size 1 as
gpu_check.sh's DDP runs do.

Each round times --steps steps (zero_grad, forward, backward, step) of each loop in turn, in an
order that rotates from round to round, after a warm-up; on a GPU a timed block ends when the
device is done. Printed: the medians over the rounds of the step times, of hvdtrain's rate over
the plain loop's (as gpu_check.sh's training rounds give it) and over DDP's, and of hvdtrain's
extra time per step and per gradient tensor over the plain loop. One rank's average is its own
gradient, so every loop must make the same step: the Linear layers must end with the same weights,
bit for bit; a torchvision model's first step must change its weights alike, to within cuDNN's
non-deterministic sums (1 % of the largest change). A difference stops the run before any figure
is printed.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("HOROVOD_ELASTIC", "1")

import torch  # noqa: E402

import hvdtrain.torch as hvd  # noqa: E402
from synthetic_benchmark import backward_and_step  # noqa: E402

UPDATE_TOLERANCE = 0.01  # of the largest change of a weight in the first step


def linear_layers(layers, device):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(layers)]).to(device)


def torchvision_model(name, device):
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, name)().to(device)


def step_function(net, optimizer, inputs, labels, autocast_dtype=None):
    """One training step of `net`: the mean square of its output for the Linear layers (labels
    None), else cross-entropy; under autocast to `autocast_dtype` where one is given, with a
    GradScaler for float16 (Horovod's pattern where `optimizer` is hvdtrain's)."""
    scaler = torch.amp.GradScaler("cuda", enabled=autocast_dtype == torch.float16)

    def step():
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            outputs = net(inputs)
            loss = outputs.square().mean() if labels is None else torch.nn.functional.cross_entropy(outputs, labels)
        backward_and_step(loss, optimizer, scaler)
    return step


def timed_steps(step, steps, device):
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def check_same_step(plain_net, plain_step, others):
    """Raise SystemExit unless one step of each loop of `others` ((label, net, step) each), from the
    plain loop's weights, changes its model as the plain step changes `plain_net`: to within
    UPDATE_TOLERANCE of the largest change of a weight."""
    before = [p.detach().clone() for p in plain_net.parameters()]
    plain_step()
    largest = max((p.detach() - b).abs().max().item() for p, b in zip(plain_net.parameters(), before))
    for label, net, step in others:
        step()
        for (name, p), q in zip(plain_net.named_parameters(), net.parameters()):
            difference = (p.detach() - q.detach()).abs().max().item()
            if difference > UPDATE_TOLERANCE * largest:
                raise SystemExit(f"{label}'s step is not the plain one: {name} changed differently, by "
                                 f"{difference:.3g} (the largest change of a weight: {largest:.3g})")


def distributed_data_parallel(net, device, directory):
    """`net` in DistributedDataParallel, in a process group of this process alone."""
    import torch.distributed as dist

    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{directory}/group",
                            rank=0, world_size=1)
    return torch.nn.parallel.DistributedDataParallel(net, device_ids=[torch.cuda.current_device()]
                                                     if device == "cuda" else None)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=160, help="Linear(16, 16) layers of the default model")
    parser.add_argument("--model", help="a torchvision model (resnet50) instead of the Linear layers")
    parser.add_argument("--batch-size", type=int, default=64, help="images a step, with --model")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--amp", action="store_true",
                        help="fp16 autocast with a GradScaler, not bf16 (--model on cuda)")
    parser.add_argument("--ddp", action="store_true", help="time PyTorch DDP at world size 1 in the same turns")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.amp and not (args.model and args.device == "cuda"):
        parser.error("--amp trains a torchvision model (--model) on a GPU (--device cuda)")
    if args.device == "cpu":
        torch.set_num_threads(1)
    hvd.init()
    generator = torch.Generator().manual_seed(1)
    loops = ["plain", "hvdtrain"] + (["DDP"] if args.ddp else [])
    if args.model:
        nets = [torchvision_model(args.model, args.device) for _ in loops]
        inputs = torch.randn(args.batch_size, 3, 224, 224, generator=generator).to(args.device)
        labels = torch.randint(1000, (args.batch_size,), generator=generator).to(args.device)
        autocast_dtype = (torch.float16 if args.amp else torch.bfloat16) if args.device == "cuda" else None
    else:
        nets = [linear_layers(args.layers, args.device) for _ in loops]
        inputs, labels, autocast_dtype = torch.randn(4, 16, generator=generator).to(args.device), None, None
    optimizers = [torch.optim.SGD(net.parameters(), lr=1e-3) for net in nets]
    optimizers[1] = hvd.DistributedOptimizer(optimizers[1], named_parameters=nets[1].named_parameters())
    with tempfile.TemporaryDirectory() as directory:
        trained = nets[:2] + ([distributed_data_parallel(nets[2], args.device, directory)] if args.ddp else [])
        steps = {loop: step_function(net, optimizer, inputs, labels, autocast_dtype)
                 for loop, net, optimizer in zip(loops, trained, optimizers)}
        if args.model:  # the models start equal; cuDNN's sums make them drift apart, step by step
            others = [(loop, net, steps[loop]) for loop, net in zip(loops[1:], nets[1:])]
            check_same_step(nets[0], steps["plain"], others)
        for loop in loops:
            timed_steps(steps[loop], args.steps, args.device)
        rounds = []
        for index in range(args.rounds):
            turn = loops[index % len(loops):] + loops[:index % len(loops)]
            rounds.append({loop: timed_steps(steps[loop], args.steps, args.device) for loop in turn})
        if args.ddp:
            torch.distributed.destroy_process_group()
    if not args.model:
        for label, net in zip(loops[1:], nets[1:]):
            for p, q in zip(nets[0].parameters(), net.parameters()):
                if not torch.equal(p, q):
                    raise SystemExit(f"the weights differ after the same steps (by {(p - q).abs().max().item()}): "
                                     f"{label}'s step is not the plain one")
    tensors = sum(1 for _ in nets[1].parameters())
    extra_s = statistics.median(r["hvdtrain"] - r["plain"] for r in rounds)
    result = {"device": args.device, "model": args.model or f"{args.layers} Linear(16, 16)",
              "precision": "fp32" if autocast_dtype is None else "fp16 AMP" if args.amp else "bf16",
              "gradient_tensors": tensors, "rounds": args.rounds, "steps": args.steps}
    result.update({f"{loop.lower()}_ms_per_step": round(statistics.median(r[loop] for r in rounds) * 1e3, 3)
                   for loop in loops})
    result["hvdtrain_over_plain"] = round(statistics.median(r["plain"] / r["hvdtrain"] for r in rounds), 3)
    if args.ddp:
        result["hvdtrain_over_ddp"] = round(statistics.median(r["DDP"] / r["hvdtrain"] for r in rounds), 3)
    result.update(extra_us_per_step=round(extra_s * 1e6), extra_us_per_tensor=round(extra_s * 1e6 / tensors, 2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
