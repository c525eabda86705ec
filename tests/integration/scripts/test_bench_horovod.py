"""scripts/bench_horovod.py's shim, on two real ranks: `import horovod.torch` is hvdtrain.torch, and
every rank reports its engine thread's CPU clock after the warm-up steps and at the end."""

import sys

from hvdtrain.launch import mpirun as launcher

from support.scripts import load_script


HOROVOD_STYLE_SCRIPT = """
import torch
import horovod.torch as hvd

hvd.init()
model = torch.nn.Linear(4, 2)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
for _ in range(4):
    optimizer.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    optimizer.step()
print("rank", hvd.rank(), "runs", hvd.__name__)
"""


def test_the_horovod_comparison_runs_horovod_scripts_on_hvdtrain_and_times_its_engine(tmp_path):
    bench = load_script("bench_horovod")
    shim = tmp_path / "shim"
    bench.write_shim(shim)
    script = tmp_path / "horovod_style.py"
    script.write_text(HOROVOD_STYLE_SCRIPT)
    environment = bench.environment("hvdtrain", shim, warmup_steps=2)
    result = launcher.run(launcher.mpirun_command([sys.executable, "-u", str(script)], num_proc=2, env=environment),
                          env=environment, timeout=240, capture=True)
    assert result.returncode == 0, result.stdout
    assert "rank 0 runs hvdtrain.torch" in result.stdout and "rank 1 runs hvdtrain.torch" in result.stdout
    reports = {path.name: [float(seconds) for seconds in path.read_text().split()] for path in shim.glob("engine-cpu.*")}
    assert sorted(reports) == ["engine-cpu.0", "engine-cpu.1"], reports
    assert all(0 < after_warmup <= at_end for after_warmup, at_end in reports.values()), reports
