"""The learning curve as a PNG: ``rlctl status RUN --plot FILE.png``.

Panels over the steps, one above the other on a shared step axis: the training
reward (raw points and a smoothed line, each reward of the run, and, for a run on its
own rewards, the held-out evals as labelled points), the accuracy of the sampled
completions with the held-out evals where the run scores with ``correct``, and the
policy's entropy, KL and clip fraction where they carry information. matplotlib is an optional extra
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
        raise ConfigError(
            f"--plot {path} is a folder", hint=f"name a file in it: --plot {p / 'curve.png'}"
        )
    if p.suffix.lower() != ".png":
        raise ConfigError(
            f"--plot {path}: the plot is a PNG image; name the file *.png",
            hint=f"--plot {p.with_suffix('.png')}",
        )
    if root := kernel_fs(p):
        raise ConfigError(
            f"--plot {path} is under {root}, a kernel file system",
            hint="write the plot to a folder on disk, e.g. --plot curve.png",
        )
    folder = p.absolute().parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise ConfigError(
            f"--plot {path}: {folder} {what}",
            hint="create the folder first, or write the plot elsewhere",
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--plot {path}: the folder {folder} is not writable",
            hint="write the plot to a folder you can write to",
        )
    return p


def render_png(curve: Curve, title: str) -> bytes:
    """The panels of ``curve`` as PNG bytes, titled ``title``: the training reward (each
    step a faint point, a smoothed line through them; each reward of the run smoothed;
    the held-out evals as points), accuracy where the run scores with ``correct``, and
    the policy's entropy, KL and clip fraction where they say something. No loss: a
    GRPO loss is near zero by construction, a panel of noise."""
    require_extra("matplotlib", EXTRA)
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from rlctl.core.runs.curve import smooth

    def nan(values: list[float | None]) -> list[float]:
        return [float("nan") if v is None else v for v in values]  # a gap in the line

    accuracy_panel = curve.scores_accuracy
    policy = [k for k in ("entropy", "kl", "clip_fraction") if curve.informative(k)]
    rows = 1 + accuracy_panel + bool(policy)
    fig = Figure(figsize=(7.5, 2.6 * rows + 0.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0])
    fig.suptitle(title)

    def raw_and_smoothed(ax, values, color: str, label: str) -> None:
        ax.plot(curve.step, nan(values), "o", markersize=3, alpha=0.35, color=color)
        ax.plot(curve.step, nan(smooth(values)), color=color, label=f"{label} (smoothed)")

    def held_out(ax, points: list[tuple[str, int, float]], color: str) -> None:
        """Each eval a point at its step, labelled; no line between them (two evals
        joined by a line read as a trend that was never measured)."""
        if not points:
            return
        ax.plot(
            [s for _, s, _ in points],
            [v for *_, v in points],
            "D",
            color=color,
            linestyle="none",
            label="held-out eval",
        )
        right = max(s for _, s, _ in points)
        for which, s, v in points:  # the rightmost label left of its point: inside
            left = s == right and s > 0
            ax.annotate(
                f"{which} {v:.3f}",
                (s, v),
                textcoords="offset points",
                xytext=(-4 if left else 4, 6),
                ha="right" if left else "left",
                fontsize=8,
            )

    reward = axes[0]
    one = list(curve.rewards) if len(curve.rewards) == 1 else []
    raw_and_smoothed(reward, curve.reward_mean, "tab:blue", one[0] if one else "total")
    for name, values in curve.rewards.items():  # each reward's own mean, unweighted
        if len(curve.rewards) > 1 or accuracy_panel:
            reward.plot(curve.step, nan(smooth(values)), linestyle="--", linewidth=1, label=name)
    if not accuracy_panel:  # the run's own reward is its held-out headline
        held_out(
            reward,
            [(e.which, e.step, e.reward) for e in curve.eval if e.reward is not None],
            "tab:red",
        )
    reward.set_ylabel("reward (training)")
    reward.legend(loc="best", fontsize=8)
    panel = 1
    if accuracy_panel:
        accuracy = axes[panel]
        panel += 1
        raw_and_smoothed(accuracy, curve.accuracy, "tab:green", "sampled completions")
        held_out(
            accuracy,
            [(e.which, e.step, e.accuracy) for e in curve.eval if e.accuracy is not None],
            "tab:red",
        )
        accuracy.set_ylim(0, 1.05)  # a fraction: the same scale in every run's plot
        accuracy.set_ylabel("accuracy")
        accuracy.legend(loc="best", fontsize=8)
    if policy:
        ax = axes[panel]
        colors = {"entropy": "tab:purple", "kl": "tab:orange", "clip_fraction": "tab:gray"}
        left = [k for k in policy if k == "entropy"]
        right = [k for k in policy if k != "entropy"]
        for k in left:
            ax.plot(curve.step, nan(curve.series(k)), color=colors[k], label=k)
        ax.set_ylabel("entropy (nats)" if left else ", ".join(right))
        other = ax.twinx() if left and right else ax
        for k in right:  # KL and clip fraction share a scale far below the entropy's
            other.plot(
                curve.step,
                nan(curve.series(k)),
                color=colors[k],
                label=k,
                linestyle="-" if other is ax else ":",
            )
        if other is not ax:
            other.set_ylabel(", ".join(right))
        handles = [h for a in {ax, other} for h in a.get_legend_handles_labels()[0]]
        ax.legend(handles=handles, loc="best", fontsize=8)
    axes[-1].set_xlabel("step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    for ax in axes:
        ax.grid(True, alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def write_plot(path: Path, curve: Curve, title: str) -> None:
    """Render and write the PNG whole (temp file + rename): a reader or a killed
    ``status`` never leaves half an image at ``path``."""
    data = render_png(curve, title)
    with writing(
        f"--plot {path}",
        elsewhere="write the plot elsewhere",
        writable="write the plot to a folder you can write to",
    ):
        atomic_write(path, data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(path, 0o666 & ~umask)  # a file for people: not the temp file's 0600
