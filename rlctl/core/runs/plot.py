"""The learning curve as a PNG: ``rlctl status RUN --plot FILE.png``.

Three panels over the steps, one above the other on a shared step axis: the mean
reward, the accuracy of the sampled completions with the held-out evals (baseline,
step-N, final) as labelled points, and the loss. matplotlib is an optional extra
(``rlctl[plot]``) and is imported only here, only when a plot is asked for; it draws
on its Agg canvas through ``Figure`` (no pyplot), so no GUI backend or global figure
state is touched.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlctl.core.errors import ConfigError, require_extra
from rlctl.core.paths import kernel_fs
from rlctl.core.runs.curve import Curve
from rlctl.core.store.base import atomic_write
from rlctl.core.store.local import writing

EXTRA = "plot"


def check_plot_path(path: str) -> Path:
    """Where ``--plot`` may write, checked before any run is read: a ``.png`` name in a
    folder that exists and can be written. A missing folder is refused, not created
    (a typo in it should not leave a new folder tree behind)."""
    p = Path(path).expanduser()
    if not path.strip():
        raise ConfigError("--plot is empty", hint="name a file: --plot curve.png")
    if p.is_dir():
        raise ConfigError(f"--plot {path} is a folder",
                          hint=f"name a file in it: --plot {p / 'curve.png'}")
    if p.suffix.lower() != ".png":
        raise ConfigError(f"--plot {path}: the plot is a PNG image; name the file *.png",
                          hint=f"--plot {p.with_suffix('.png')}")
    if root := kernel_fs(p):
        raise ConfigError(f"--plot {path} is under {root}, a kernel file system",
                          hint="write the plot to a folder on disk, e.g. --plot curve.png")
    folder = p.absolute().parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise ConfigError(f"--plot {path}: {folder} {what}",
                          hint="create the folder first, or write the plot elsewhere")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--plot {path}: the folder {folder} is not writable",
                          hint="write the plot to a folder you can write to")
    return p


def render_png(curve: Curve, title: str) -> bytes:
    """The three panels of ``curve`` as PNG bytes, titled ``title``."""
    require_extra("matplotlib", EXTRA)
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    def nan(values: list[float | None]) -> list[float]:
        return [float("nan") if v is None else v for v in values]  # a gap in the line

    fig = Figure(figsize=(7.5, 7.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    reward, accuracy, loss = fig.subplots(3, 1, sharex=True)
    fig.suptitle(title)
    marker = "o" if len(curve.step) < 30 else None  # a few steps: show each one
    reward.plot(curve.step, nan(curve.reward_mean), marker=marker, color="tab:blue",
                label="total (weighted)")
    for name, values in curve.rewards.items():  # each reward's own mean, unweighted
        reward.plot(curve.step, nan(values), linestyle="--", linewidth=1, label=name)
    if curve.rewards:
        reward.legend(loc="best", fontsize=8)
    reward.set_ylabel("mean reward")
    accuracy.plot(curve.step, nan(curve.accuracy), marker=marker, color="tab:green",
                  label="sampled completions")
    evals = [e for e in curve.eval if e.accuracy is not None]
    if evals:
        accuracy.plot([e.step for e in evals], [e.accuracy for e in evals], "D--",
                      color="tab:red", label="held-out eval")
        right = max(e.step for e in evals)
        for e in evals:  # the rightmost label to the left of its point: inside the axes
            left = e.step == right and e.step > 0
            accuracy.annotate(f"{e.which} {e.accuracy:.3f}", (e.step, e.accuracy),
                              textcoords="offset points", xytext=(-4 if left else 4, 6),
                              ha="right" if left else "left", fontsize=8)
    accuracy.set_ylim(0, 1.05)  # a fraction: its scale is the same in every run's plot
    accuracy.set_ylabel("accuracy")
    accuracy.legend(loc="best", fontsize=8)
    loss.plot(curve.step, nan(curve.loss), marker=marker, color="tab:purple")
    loss.set_ylabel("loss")
    loss.set_xlabel("step")
    loss.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    for ax in (reward, accuracy, loss):
        ax.grid(True, alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def write_plot(path: Path, curve: Curve, title: str) -> None:
    """Render and write the PNG whole (temp file + rename): a reader or a killed
    ``status`` never leaves half an image at ``path``."""
    data = render_png(curve, title)
    with writing(f"--plot {path}", elsewhere="write the plot elsewhere",
                 writable="write the plot to a folder you can write to"):
        atomic_write(path, data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(path, 0o666 & ~umask)  # a file for people: not the temp file's 0600
