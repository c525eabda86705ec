"""What hvdtrain.torch's DistributedOptimizer costs the training thread a step, against plain
torch.optim on the same model: the price a host-bound GPU loop pays in full.

    python scripts/bench_optimizer_overhead.py [--layers 160] [--device cpu|cuda] [--rounds 7]

One process, with HOROVOD_ELASTIC=1: Horovod's DistributedOptimizer reduces nothing in a job of
one rank unless the job is elastic (its world may grow), so this marks the job elastic to have
the gradients go through the engine, as gpu_check.sh's hvdtrain runs do. The model has --layers
Linear(16, 16) layers (two gradient tensors each, so that the cost per tensor dominates, not
arithmetic). Each round times --steps steps (zero_grad, forward, backward, step) of the plain
optimizer and of hvdtrain's, in turn, after a warm-up; on a GPU a timed block ends when the
device is done. Printed: the medians over the rounds of both step times, and of hvdtrain's
extra per step and per gradient tensor. One rank's average is its own gradient, so both models
must end with the same weights, bit for bit: a difference stops the run before any figure is
printed.
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HOROVOD_ELASTIC", "1")

import torch  # noqa: E402

import hvdtrain.torch as hvd  # noqa: E402


def model(layers, device):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(layers)]).to(device)


def timed_steps(net, optimizer, inputs, steps):
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        net(inputs).square().mean().backward()
        optimizer.step()
    if inputs.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=160)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    hvd.init()
    inputs = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(args.device)
    plain_net, hvd_net = model(args.layers, args.device), model(args.layers, args.device)
    plain = torch.optim.SGD(plain_net.parameters(), lr=1e-3)
    distributed = hvd.DistributedOptimizer(torch.optim.SGD(hvd_net.parameters(), lr=1e-3),
                                           named_parameters=hvd_net.named_parameters())
    timed_steps(plain_net, plain, inputs, args.steps)
    timed_steps(hvd_net, distributed, inputs, args.steps)
    rounds = []
    for _ in range(args.rounds):
        rounds.append((timed_steps(plain_net, plain, inputs, args.steps),
                       timed_steps(hvd_net, distributed, inputs, args.steps)))
    for p, q in zip(plain_net.parameters(), hvd_net.parameters()):
        if not torch.equal(p, q):
            raise SystemExit(f"the weights differ after the same steps (by {(p - q).abs().max().item()}): "
                             f"hvdtrain's step is not the plain one")
    tensors = 2 * args.layers
    plain_s = statistics.median(r[0] for r in rounds)
    hvd_s = statistics.median(r[1] for r in rounds)
    extra_s = statistics.median(r[1] - r[0] for r in rounds)
    print(json.dumps({"device": args.device, "gradient_tensors": tensors, "rounds": args.rounds,
                      "plain_ms_per_step": round(plain_s * 1e3, 3), "hvdtrain_ms_per_step": round(hvd_s * 1e3, 3),
                      "extra_us_per_step": round(extra_s * 1e6), "extra_us_per_tensor": round(extra_s * 1e6 / tensors, 2)}))


if __name__ == "__main__":
    main()
