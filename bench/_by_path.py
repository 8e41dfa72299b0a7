"""A bench script run by its path (``python bench/NAME.py``) runs again as the module
``python -m bench.NAME``, with the checkout's root first on ``PYTHONPATH``.

Python puts only the script's own folder on the module path, so neither the ``bench``
package (its siblings) nor ``tests`` (the fakes some benches drive) would import, and
``rlctl`` would be whichever the interpreter has installed. Each script's guard

    if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
        import _by_path

        _by_path.rerun_as_module(__file__)

imports this module (the script's folder is on the path: the one case it runs in) and
replaces the process, with the same interpreter, arguments and working directory, by
the module run from the checkout: no module path edited in this process, and a script
run where ``bench`` already imports (from the root, or ``runpy.run_path`` there, as
../shared/gpu/run.sh does) goes on in place.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn


def rerun_as_module(script: str) -> NoReturn:
    """Replace this process by ``python -m bench.<script's stem>`` from the checkout
    ``script`` lives in (its folder's parent), with this process's arguments."""
    path = Path(script).resolve()
    root = str(path.parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", f"bench.{path.stem}", *sys.argv[1:]], env)
