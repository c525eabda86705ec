"""report.md's plots (hvdtrain/reporting/report.py): each one says what its axes measure."""

import matplotlib.pyplot as plt

from hvdtrain.reporting import report

HISTORY = [{"event": "train", "step": s, "loss": 2.0 / (s + 1), "lr": 0.1} for s in range(3)] + \
    [{"event": "eval", "step": 2, "val_loss": 0.7, "val_top1": 80.0, "val_top5": 99.0}]


def test_every_plot_labels_both_axes(tmp_path, monkeypatch):
    closed = []
    monkeypatch.setattr(plt, "close", closed.append)
    assert report._plot_history(HISTORY, None, tmp_path) == ["loss", "accuracy", "lr"]
    labels = {figure.axes[0].get_title(): (figure.axes[0].get_xlabel(), figure.axes[0].get_ylabel())
              for figure in closed}
    assert labels == {"loss": ("optimizer step", "cross-entropy loss"), "accuracy": ("optimizer step", "accuracy (%)"),
                      "lr": ("optimizer step", "learning rate")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["accuracy.png", "loss.png", "lr.png"]
