"""A run's account of itself, kept by rank 0: progress and the loss agreed by the ranks
(progress.py), metrics.jsonl, TensorBoard and the progress bar (run_log.py), results.json,
report.md and the closing summary (report.py)."""
