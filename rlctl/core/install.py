"""How this rlctl was installed, and so the command that adds an extra to it.

rlctl is not on PyPI: ``pip install 'rlctl[gcp]'`` would fetch another project or
nothing. The hint must name what the user installed from, which pip recorded in the
distribution's ``direct_url.json`` (PEP 610): a source folder installed with ``-e``,
a local folder or wheel, a git URL, or (no record) an index.
"""

from __future__ import annotations

import json
import shlex
from urllib.parse import unquote, urlparse

DIST = "rlctl"


def _source() -> tuple[str, bool] | None:
    """(where rlctl was installed from, editable?) or None: an index, or unknown."""
    import importlib.metadata as im

    # every copy of the metadata on sys.path: run from a checkout, the build's
    # rlctl.egg-info (no direct_url.json) comes before the installed dist-info
    text = next(
        (t for d in im.distributions(name=DIST) if (t := d.read_text("direct_url.json"))), None
    )
    if not text:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None
    url = str(info.get("url") or "")
    if not url:
        return None
    editable = bool((info.get("dir_info") or {}).get("editable"))
    if url.startswith("file://"):
        return unquote(urlparse(url).path), editable
    vcs = info.get("vcs_info") or {}
    if vcs.get("vcs"):  # pip's spelling: git+https://...@commit
        ref = vcs.get("requested_revision") or vcs.get("commit_id")
        return f"{vcs['vcs']}+{url}" + (f"@{ref}" if ref else ""), editable
    return url, editable


def extra_install_command(extra: str, force: bool = False, constrained: bool = False) -> str:
    """The pip command that adds ``extra`` to this installation of rlctl (``force``:
    reinstall it too, for files missing from the installed package; ``constrained``:
    with the checkout's recorded versions, ``-c constraints.txt``, where it has them)."""
    pip = "pip install --force-reinstall" if force else "pip install"
    src = _source()
    if constrained and src is not None and "://" not in src[0]:
        from pathlib import Path

        pins = Path(src[0]) / "constraints.txt"
        if pins.is_file():
            pip += f" -c {shlex.quote(str(pins))}"
    if src is None:
        return f"{pip} {shlex.quote(f'{DIST}[{extra}]')}"
    where, editable = src
    if "://" in where:  # a URL: the PEP 508 spelling keeps the extra apart from it
        return f"{pip} {shlex.quote(f'{DIST}[{extra}] @ {where}')}"
    flag = " -e" if editable else ""  # a folder or a wheel file: extras follow the path
    return f"{pip}{flag} {shlex.quote(f'{where}[{extra}]')}"


def self_install_command() -> str:
    """For an rlctl imported without being installed (``PYTHONPATH`` on a checkout):
    install that checkout, editable."""
    from pathlib import Path

    # the folder that holds this package: named for the hint, never read (data at run
    # time comes from inside the package: tests/core/k8s/test_package_crds.py)
    checkout = Path(__file__).resolve().parent.parent.parent
    return f"pip install -e {shlex.quote(str(checkout))}"
