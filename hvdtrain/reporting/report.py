"""What a run leaves behind for people: results.json, report.md with its plots, and the
closing summary on the console. Framework-neutral: it reads metrics.jsonl and plain numbers.

The throughput figures of results.json, the same for every framework, and how they divide:
- samples_trained: the optimizer steps that make up the trained model x the global batch (a step
  that a crashed session took after its last checkpoint, and the resumed run took again, counts
  once);
- wall_time_s: the run's wall time, over its sessions: each from its process start (set-up, data
  loading, evaluation and checkpoints included) to its last checkpoint, the last one to now;
- train_time_s: the part of wall_time_s spent inside training steps (fetching the batch, forward,
  backward, the gradients' allreduce, the update);
- train_samples_per_s = samples_trained / train_time_s, the step throughput; `samples_per_s` is
  the same figure under its older name;
- wall_samples_per_s = samples_trained / wall_time_s;
- command_time_s, added by the `hvdtrain` command once its job has ended: what the user waited,
  from the command's start to the job's end (composing the config, starting the ranks, restarts
  and their waits, the report included); a resumed run's counts the resuming command only, a
  sweep's later job from the end of the job before.
"""

import json
import time
from pathlib import Path

from hvdtrain.reporting.run_log import read_history
from hvdtrain.run.plan import warmup_text
from hvdtrain.run.run_dir import write_atomically


def write_results(run_dir, cfg, plan, epochs_completed, metrics, samples_trained, wall_time_s, train_time_s,
                  inputs=None):
    """results.json (see the module's docstring for the figures); rewritten as the run goes.
    `inputs`: what the input pipeline met in the last epoch, where it counts anything."""
    target = cfg.recipe.target
    achieved = None if target is None else metrics.get(target.metric)
    train_samples_per_s = _per_second(samples_trained, train_time_s)
    restarts = [record for record in read_history(Path(run_dir) / "metrics.jsonl") if record["event"] == "restart"]
    results = {
        "recipe": cfg.recipe.name,
        "framework": cfg.recipe.framework,
        "world_size": plan.world_size,
        "global_batch_size": plan.global_batch_size,
        "peak_lr": plan.peak_lr,
        "epochs_completed": epochs_completed,
        "epochs": plan.epochs,
        "metrics": metrics,
        "target": None if target is None else {"metric": target.metric, "value": target.value, "source": target.source},
        "target_reached": None if achieved is None else achieved >= target.value,
        "samples_trained": samples_trained,
        "wall_time_s": wall_time_s,
        "train_time_s": train_time_s,
        "train_samples_per_s": train_samples_per_s,
        "wall_samples_per_s": _per_second(samples_trained, wall_time_s),
        "samples_per_s": train_samples_per_s,
        "restarts": restarts,
    }
    if inputs is not None:
        results["inputs_last_epoch"] = inputs
    write_atomically(Path(run_dir) / "results.json", (json.dumps(results, indent=2) + "\n").encode())
    return results


def record_command_time(run_dir, seconds):
    """Add command_time_s to the run's results.json (none where the job wrote none)."""
    path = Path(run_dir) / "results.json"
    if path.is_file():
        results = {**json.loads(path.read_text()), "command_time_s": seconds}
        write_atomically(path, (json.dumps(results, indent=2) + "\n").encode())


def _per_second(samples, seconds):
    return samples / seconds if seconds else 0.0


def throughput(results):
    """The two figures as the summary and the report print them, each beside what it divides."""
    return (f"{results['samples_trained']} samples in {results['wall_time_s']:.1f} s of the ranks' wall time "
            f"({results['wall_samples_per_s']:.1f} samples/s), {results['train_time_s']:.1f} s of it in training "
            f"steps ({results['train_samples_per_s']:.1f} samples/s)")


def write_report(run_dir, cfg, plan, results):
    """report.md: the plan, the result against the target, and the curves as PNG plots."""
    run_dir = Path(run_dir)
    plots = _plot_history(read_history(run_dir / "metrics.jsonl"), cfg.recipe.target, run_dir)
    target = results["target"]
    lines = [
        f"# {cfg.recipe.name}: {cfg.recipe.description}".rstrip(": "),
        "",
        "| | |",
        "|---|---|",
        f"| model | {cfg.model.name} ({cfg.model.num_classes} classes) |",
        f"| data | {cfg.data.source}{' at ' + cfg.data.root if cfg.data.root else ''} |",
        f"| ranks | {plan.world_size} on {', '.join(f'{h.host}:{h.slots}' for h in plan.hosts)} |",
        f"| global batch | {plan.global_batch_size} ({plan.per_worker_batch_size} per worker x "
        f"{plan.backward_passes_per_step} backward passes) |",
        f"| LR | {plan.base_lr:g} per {plan.base_batch_size} -> peak {plan.peak_lr:g}, "
        f"{warmup_text(plan)}, {cfg.schedule.decay} decay |",
        f"| epochs | {results['epochs_completed']} of {results['epochs']} |",
        f"| trained | {throughput(results)} |",
        "",
        "## Result",
        "",
    ]
    lines += [f"- {name}: {value:.4g}" for name, value in results["metrics"].items()] or ["- no validation"]
    if target is not None:
        achieved = results["metrics"].get(target["metric"])
        verdict = "not measured" if achieved is None else "reached" if results["target_reached"] else "not reached"
        lines += ["", f"Target: {target['metric']} {target['value']:g} ({target['source']}): **{verdict}**."]
    if results["restarts"]:
        lines += ["", "## Restarts", ""] + [
            f"- {r['attempt']}. at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['time']))}, from step "
            f"{r['step']} ({r['steps_lost']} steps lost): {r['reason']}" for r in results["restarts"]]
    lines += [""] + [f"![{name}]({name}.png)" for name in plots]
    lines += ["", "Files: `config.yaml` (the resolved config), `metrics.jsonl`, `results.json`, `checkpoints/`, "
                  f"`tensorboard/` (`tensorboard --logdir {run_dir / 'tensorboard'}`)."]
    (run_dir / "report.md").write_text("\n".join(lines) + "\n")


def _plot_history(history, target, run_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in history if r["event"] == "train"]
    evals = [r for r in history if r["event"] == "eval"]
    curves = {  # plot: (its y axis, its curves)
        "loss": ("cross-entropy loss", [("train loss", train, "loss"), ("validation loss", evals, "val_loss")]),
        "accuracy": ("accuracy (%)", [("validation top-1 %", evals, "val_top1"), ("validation top-5 %", evals,
                                                                                  "val_top5")]),
        "lr": ("learning rate", [("learning rate", train, "lr")]),
    }
    written = []
    for name, (y_label, series) in curves.items():
        series = [(label, [r for r in records if key in r], key) for label, records, key in series]
        if not any(records for _, records, _ in series):
            continue
        figure, axes = plt.subplots(figsize=(7, 4))
        for label, records, key in series:
            if records:
                axes.plot([r["step"] for r in records], [r[key] for r in records], label=label,
                          marker="o" if key.startswith("val_") else None)
        if name == "loss":
            for number, restart in enumerate(r for r in history if r["event"] == "restart"):
                axes.axvline(restart["step"], color="grey", linestyle=":", label=None if number else "restarted")
        if name == "accuracy" and target is not None:
            axes.axhline(target.value, color="red", linestyle="--", label=f"target {target.metric} {target.value:g}")
        axes.set_xlabel("optimizer step")
        axes.set_ylabel(y_label)
        axes.set_title(name)
        axes.legend()
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(run_dir / f"{name}.png", dpi=100)
        plt.close(figure)
        written.append(name)
    return written


def final_summary(results, run_dir):
    """The lines printed at the end: achieved vs target, and where everything is."""
    run_dir = Path(run_dir)
    lines = [f"hvdtrain: {results['recipe']} finished {results['epochs_completed']} of {results['epochs']} epochs on "
             f"{results['world_size']} ranks: {throughput(results)}"]
    target = results["target"]
    for name, value in results["metrics"].items():
        line = f"  {name:<12} {value:.4g}"
        if target is not None and name == target["metric"]:
            line += (f"   target {target['value']:g}: {'reached' if results['target_reached'] else 'NOT reached'}"
                     f" ({target['source']})")
        lines.append(line)
    inputs = results.get("inputs_last_epoch")
    if inputs and any(inputs.values()):
        lines.append(f"  inputs       in the last epoch {inputs['decoded_on_cpu']} files decoded by PIL (not the GPU's "
                     f"decoder), {inputs['bad_files_skipped']} unreadable files skipped (data.bad_files=skip)")
    lines += [f"  results      {run_dir / 'results.json'}",
              f"  report       {run_dir / 'report.md'}",
              f"  tensorboard  tensorboard --logdir {run_dir / 'tensorboard'}"]
    return "\n".join(lines)
