"""What hvdtrain.torch's DistributedOptimizer costs the training thread a step, against plain
torch.optim on the same model: the price a host-bound GPU loop pays in full.

    python scripts/bench_optimizer_overhead.py [--layers 160] [--device cpu|cuda] [--rounds 7]
    python scripts/bench_optimizer_overhead.py --device cuda --model resnet50 --batch-size 64

One process, with HOROVOD_ELASTIC=1: Horovod's DistributedOptimizer reduces nothing in a job of
one rank unless the job is elastic (its world may grow), so this marks the job elastic to have
the gradients go through the engine, as gpu_check.sh's hvdtrain runs do. By default the model has
--layers Linear(16, 16) layers (two gradient tensors each, so that the cost per tensor dominates,
not arithmetic). With --model, a torchvision model of that name trains on one synthetic batch of
--batch-size images, under bf16 autocast on CUDA (as train.autocast=bf16): the training loop of a
real model, where timing the plain loop and hvdtrain's in the same process, in turn, leaves out
what differs from one process to the next (the GPU's clocks, where the threads land), which
separate runs of each loop cannot.

Each round times --steps steps (zero_grad, forward, backward, step) of the plain optimizer and of
hvdtrain's, in turn, after a warm-up; on a GPU a timed block ends when the device is done.
Printed: the medians over the rounds of both step times, of hvdtrain's rate over the plain loop's
(as gpu_check.sh's training rounds give it) and of hvdtrain's extra time per step and per
gradient tensor. One rank's average is its own gradient, so the two optimizers must
make the same step: the Linear layers must end with the same weights, bit for bit; a torchvision
model's first step must change its weights alike, to within cuDNN's non-deterministic sums (1 % of
the largest change). A difference stops the run before any figure is printed.
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HOROVOD_ELASTIC", "1")

import torch  # noqa: E402

import hvdtrain.torch as hvd  # noqa: E402

UPDATE_TOLERANCE = 0.01  # of the largest change of a weight in the first step


def linear_layers(layers, device):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(layers)]).to(device)


def torchvision_model(name, device):
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, name)().to(device)


def step_function(net, optimizer, inputs, labels):
    """One training step of `net`: the mean square of its output for the Linear layers (labels
    None), else cross-entropy under bf16 autocast on CUDA."""
    autocast = labels is not None and inputs.is_cuda

    def step():
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            outputs = net(inputs)
            loss = outputs.square().mean() if labels is None else torch.nn.functional.cross_entropy(outputs, labels)
        loss.backward()
        optimizer.step()
    return step


def timed_steps(step, steps, device):
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def check_same_step(plain_net, hvd_net, plain_step, hvd_step):
    """Raise SystemExit unless one step of each, from equal weights, changes the two models alike:
    to within UPDATE_TOLERANCE of the largest change of a weight."""
    before = [p.detach().clone() for p in plain_net.parameters()]
    plain_step()
    hvd_step()
    largest = max((p.detach() - b).abs().max().item() for p, b in zip(plain_net.parameters(), before))
    for (name, p), q in zip(plain_net.named_parameters(), hvd_net.parameters()):
        difference = (p.detach() - q.detach()).abs().max().item()
        if difference > UPDATE_TOLERANCE * largest:
            raise SystemExit(f"hvdtrain's step is not the plain one: {name} changed differently, by "
                             f"{difference:.3g} (the largest change of a weight: {largest:.3g})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=160, help="Linear(16, 16) layers of the default model")
    parser.add_argument("--model", help="a torchvision model (resnet50) instead of the Linear layers")
    parser.add_argument("--batch-size", type=int, default=64, help="images a step, with --model")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    hvd.init()
    generator = torch.Generator().manual_seed(1)
    if args.model:
        plain_net, hvd_net = (torchvision_model(args.model, args.device) for _ in range(2))
        inputs = torch.randn(args.batch_size, 3, 224, 224, generator=generator).to(args.device)
        labels = torch.randint(1000, (args.batch_size,), generator=generator).to(args.device)
    else:
        plain_net, hvd_net = (linear_layers(args.layers, args.device) for _ in range(2))
        inputs, labels = torch.randn(4, 16, generator=generator).to(args.device), None
    plain = torch.optim.SGD(plain_net.parameters(), lr=1e-3)
    distributed = hvd.DistributedOptimizer(torch.optim.SGD(hvd_net.parameters(), lr=1e-3),
                                           named_parameters=hvd_net.named_parameters())
    plain_step = step_function(plain_net, plain, inputs, labels)
    hvd_step = step_function(hvd_net, distributed, inputs, labels)
    if args.model:  # the models start equal; cuDNN's sums make them drift apart, step by step
        check_same_step(plain_net, hvd_net, plain_step, hvd_step)
    timed_steps(plain_step, args.steps, args.device)
    timed_steps(hvd_step, args.steps, args.device)
    rounds = []
    for _ in range(args.rounds):
        rounds.append((timed_steps(plain_step, args.steps, args.device),
                       timed_steps(hvd_step, args.steps, args.device)))
    if not args.model:
        for p, q in zip(plain_net.parameters(), hvd_net.parameters()):
            if not torch.equal(p, q):
                raise SystemExit(f"the weights differ after the same steps (by {(p - q).abs().max().item()}): "
                                 f"hvdtrain's step is not the plain one")
    tensors = sum(1 for _ in hvd_net.parameters())
    plain_s = statistics.median(r[0] for r in rounds)
    hvd_s = statistics.median(r[1] for r in rounds)
    extra_s = statistics.median(r[1] - r[0] for r in rounds)
    print(json.dumps({"device": args.device, "model": args.model or f"{args.layers} Linear(16, 16)",
                      "gradient_tensors": tensors, "rounds": args.rounds, "steps": args.steps,
                      "plain_ms_per_step": round(plain_s * 1e3, 3), "hvdtrain_ms_per_step": round(hvd_s * 1e3, 3),
                      "hvdtrain_over_plain": round(statistics.median(r[0] / r[1] for r in rounds), 3),
                      "extra_us_per_step": round(extra_s * 1e6),
                      "extra_us_per_tensor": round(extra_s * 1e6 / tensors, 2)}))


if __name__ == "__main__":
    main()
