"""Rows of a Hugging Face hub dataset, through the ``datasets`` library.

Online it is ``datasets.load_dataset(repo, config, split=split)``. When the hub
cannot be reached (``HF_HUB_OFFLINE=1``, or the endpoint does not answer within
``PROBE_SECONDS``) nothing touches the network, so there are no retries: the
dataset is read from what is on this machine, first a snapshot in the hub cache
(``$HF_HUB_CACHE/datasets--OWNER--NAME/snapshots/SHA``, as ``hf download`` and
online loads leave it; huggingface_hub ``_snapshot_download.py``, 1.33), loaded with
``datasets.load_dataset(snapshot, config, split=...)`` which reads the repo's README
``configs``; then the ``datasets`` cache of a previous load
(``$HF_DATASETS_CACHE/owner___name/CONFIG/...``; datasets 5.2 ``load.py``,
``CachedDatasetModuleFactory``). Nothing there is one line saying so.

The libraries' log lines and progress bars are silenced while this runs: their
retries and "Using the latest cached version" warnings are not the user's business,
and a bad config or split comes back as one line.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlctl.core.errors import ConfigError

PROBE_SECONDS = 2.0  # a connection that has not answered in 2 s is offline here


def hub_rows(repo: str, config: str | None, split: str) -> list[tuple[str, Any]]:
    """(``repo split: row N``, row) for every row of one split of a hub dataset."""
    import importlib.util

    if importlib.util.find_spec("datasets") is None:
        raise ConfigError(
            f"loading {repo} from the hub needs the 'datasets' package",
            hint="pip install datasets, or pass --data-path FILE",
        )
    local: str | None = None
    off = offline()
    if off:
        local = _snapshot(repo)
        # said before importing datasets (3 s on a busy machine): offline with nothing
        # on this machine fails at once
        if local is None and not _in_datasets_cache(repo):
            raise ConfigError(
                f"{repo} is not on this machine and the Hugging Face hub cannot be reached "
                "(offline)",
                hint=f"where the hub is reachable run 'hf download {repo} --repo-type "
                "dataset' and copy ~/.cache/huggingface here, or pass --data-path FILE",
            )
    import datasets

    with _quiet(datasets):
        ds = _load(datasets, repo, config, split, off, local)
    name = f"{repo}{f' ({config})' if config else ''} {split}"
    return [(f"{name}: row {n}", row) for n, row in enumerate(ds, 1)]


def offline() -> bool:
    """True when the hub is not to be asked: HF_HUB_OFFLINE, or no answer from its
    endpoint in PROBE_SECONDS (through the proxies httpx reads from the environment)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    import httpx  # half a second: only when the flag does not say

    try:
        httpx.head(constants.ENDPOINT, timeout=PROBE_SECONDS, follow_redirects=False)
    except httpx.HTTPError:
        return True
    return False


def _load(
    datasets: Any, repo: str, config: str | None, split: str, off: bool, local: str | None
) -> Any:
    """One split: from the hub when online; offline, from the hub cache's snapshot
    (``local``) or else the datasets cache, with the libraries told not to connect."""
    if not off:
        try:
            return datasets.load_dataset(repo, config, split=split)
        except Exception as e:
            raise _one_line(e, repo, config, split) from None
    with _no_network(datasets):
        try:
            return datasets.load_dataset(local or repo, config, split=split)
        except Exception as e:
            raise _one_line(e, repo, config, split) from None


def _in_datasets_cache(repo: str) -> bool:
    """Whether the datasets cache may hold a previous load of ``repo``: a folder
    ``OWNER___*`` in it (datasets 5.2 ``CachedDatasetModuleFactory``; the name's part
    is snake-cased there, so the owner's prefix is what can be matched without it)."""
    import os

    from huggingface_hub import constants

    cache = Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets")
    owner = repo.split("/")[0]
    return cache.is_dir() and any(cache.glob(f"{owner}___*"))


def _snapshot(repo: str) -> str | None:
    """The folder of the repo's ``main`` snapshot in the hub cache, if there is one:
    ``refs/main`` names the commit whose ``snapshots/`` folder holds the files (read
    here as huggingface_hub's ``snapshot_download(local_files_only=True)`` reads it,
    without its second of imports)."""
    from huggingface_hub import constants

    root = Path(constants.HF_HUB_CACHE) / f"datasets--{repo.replace('/', '--')}"
    try:
        commit = (root / "refs" / "main").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    folder = root / "snapshots" / commit
    return str(folder) if commit and folder.is_dir() else None


def _named_configs(text: str) -> list[str]:
    """The configs a ``datasets`` error lists, wherever in its message: "Config name is
    missing." says them on its second line (#47: cut to its first, none were shown),
    "There are multiple ... configurations in the cache: a, b" and "BuilderConfig 'x'
    not found. Available: [...]" on their first."""
    import re

    m = re.search(r"available configs: \[([^\]]*)\]", text, re.IGNORECASE) or re.search(
        r"configurations in the cache: ([^\n]*)", text
    )
    if not m:
        return []
    return [c.strip(" '\"") for c in m.group(1).split(",") if c.strip(" '\"")]


def _cached_configs(repo: str) -> list[str]:
    """The configs of ``repo`` a previous load left in the datasets cache
    (``OWNER___NAME/CONFIG/``; see ``_in_datasets_cache``)."""
    import os

    from huggingface_hub import constants

    cache = Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets")
    owner = repo.split("/")[0]
    folders = [p for p in cache.glob(f"{owner}___*") if p.is_dir()] if cache.is_dir() else []
    if len(folders) != 1:
        return []
    return sorted(c.name for c in folders[0].iterdir() if c.is_dir() and c.name[0] != ".")


def _one_line(e: Exception, repo: str, config: str | None, split: str) -> ConfigError:
    """A library error as one line: the first line of its message, which for a bad
    config or split lists the ones the dataset has; for a missing or unknown config,
    the configs the dataset has, wherever the library said them (or the cache holds
    them), and the setting that picks one."""
    from datasets.exceptions import DatasetNotFoundError

    text = str(e).strip()
    first = (text.splitlines() or [type(e).__name__])[0][:300]
    if isinstance(e, DatasetNotFoundError):
        return ConfigError(
            f"cannot load {repo} from the hub: {first}",
            hint="check the id; a gated or private dataset needs HF_TOKEN",
        )
    configs = _named_configs(text)
    if not configs and "Couldn't find cache" in text:
        configs = _cached_configs(repo)
    if configs and ("Config name is missing" in text or "multiple" in text):
        return ConfigError(
            f"{repo} has several configs ({', '.join(configs)}): name one",
            hint=f"--set data.config={configs[0]}",
        )
    if configs and config is not None and config not in configs:
        return ConfigError(
            f"{repo} has no config {config!r} here (its configs: {', '.join(configs)})",
            hint=f"--set data.config={configs[0]}",
        )
    return ConfigError(
        f"cannot load {repo} (config {config or 'default'}, split {split}): {first}",
        hint="set data.config / data.split / data.eval_split",
    )


@contextlib.contextmanager
def _no_network(datasets: Any) -> Iterator[None]:
    """Offline mode for this load only: both libraries read these flags at call time."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = before


@contextlib.contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """No log lines, progress bars or warnings from datasets and huggingface_hub."""
    from huggingface_hub import utils as hf_utils
    from huggingface_hub.utils import logging as hf_logging

    levels = datasets.logging.get_verbosity(), hf_logging.get_verbosity()
    bars = datasets.is_progress_bar_enabled(), not hf_utils.are_progress_bars_disabled()
    datasets.logging.set_verbosity_error()
    hf_logging.set_verbosity_error()
    datasets.disable_progress_bars()
    with contextlib.suppress(Exception):  # HF_HUB_DISABLE_PROGRESS_BARS=0 has priority
        hf_utils.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        datasets.logging.set_verbosity(levels[0])
        hf_logging.set_verbosity(levels[1])
        if bars[0]:
            datasets.enable_progress_bars()
        if bars[1]:
            with contextlib.suppress(Exception):
                hf_utils.enable_progress_bars()
