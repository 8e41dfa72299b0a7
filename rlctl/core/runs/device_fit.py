"""The fit check of a cluster run: its programs compiled for the cluster's accelerator
(which is not here) before anything is applied, and the setting that makes a run fit
when it does not.

Hop 3 of ``rlctl train --cluster C [--dry-run]`` (``cluster.submit``) and of a cluster
``resume``: ``check`` builds the compile-only target from the catalog
(``core/config/compile_targets.py``), reads the model's config.json (no weights), and
runs the trainer's fit check (``rlctl.core.trainer.device_fit``) in a process of its own,
where JAX sees no accelerator and the compiler's working memory is returned when it
ends. Without the extra that compiles for the accelerator (``rlctl[compile-tpu]``,
``rlctl[compile-gpu]``) nothing is compiled and the plan says what it did not check.

MaxText's ``train_compile.py`` is the anchor: the same compile-only devices, run by
hand before a job; here it is part of every submit's plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from rlctl.core.config.catalog import lookup
from rlctl.core.config.compile_targets import CompileTarget, compile_target
from rlctl.core.config.models import RunSpec
from rlctl.core.errors import ConfigError, MissingDependencyError, OutOfMemoryError, RlctlError
from rlctl.core.trainer import api

OnLine = Callable[[str], None]
FIT_ENV = "RLCTL_FIT_CHECK"  # "off": skip it (a plan says so)
# the child's environment: JAX there must not initialize the accelerator backends it
# compiles for (the CUDA plugin prints a traceback where no GPU is; libtpu probes for
# TPU hosts), nor preallocate anything; and libtpu must not refuse to load because
# another process holds it (a second dry run, a notebook, the process that started this
# one): its lockfile guards the chips, which a compile-only child never opens
# (ALLOW_MULTIPLE_LIBTPU_LOAD, as jax/_src/test_multiprocess.py sets for its processes)
_CHILD_ENV = {
    "JAX_PLATFORMS": "cpu",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TPU_STDERR_LOG_LEVEL": "3",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def check(
    spec: RunSpec,
    accelerator: str,
    count: int,
    engine: str = "vanilla",
    on_line: OnLine | None = None,
    storage: Any = None,
) -> api.DeviceFit:
    """``spec``'s update, rollout and eval compiled for ``count`` of ``accelerator``
    (a catalog name): their peak device memory per chip, and (``fix``) what makes the
    run fit when it does not. ``storage``: a Cloud Storage client, for a model in a
    bucket (its config.json alone is read). Never raises for what it cannot check: the
    report says."""
    acc = lookup(accelerator)
    label = acc.name if count == 1 else f"{acc.name} x{count}"
    if os.environ.get(FIT_ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return _unchecked(label, f"{FIT_ENV}=off")
    target = compile_target(acc, count)
    if target is None:
        return _unchecked(
            label, f"rlctl has no device description of {acc.gpu_type or acc.name} to compile for"
        )
    if why := api.fit_missing_extra(target):
        from rlctl.core.install import extra_install_command

        return _unchecked(label, f"{why}: {extra_install_command(target.extra, constrained=True)}")
    source = spec.model.source
    if source.startswith("gs://"):
        config, why = _bucket_config(source, storage)
    else:
        config, why = api.source_config(source)
    if config is None:
        return _unchecked(label, why or "the model's config.json cannot be read here")
    report = _run_child(spec, config, target, engine, on_line)
    if report.checked and not report.fits:
        report.fix = api.fit_fix(report, spec, acc, count)
    return report


def refuse(report: api.DeviceFit) -> None:
    """Raise when the run cannot fit: one line with the peak, the chip's memory and the
    setting that makes it fit; nothing has been applied."""
    if report.checked and not report.fits:
        raise OutOfMemoryError(
            f"the run does not fit {report.target}: {report.amount}",
            hint=report.fix,
        )


def _bucket_config(uri: str, storage: Any) -> tuple[dict[str, Any] | None, str | None]:
    """config.json of a model folder in a bucket, or (None, why not)."""
    bucket, _, prefix = uri[len("gs://") :].partition("/")
    name = f"{prefix.rstrip('/')}/config.json" if prefix.strip("/") else "config.json"
    if storage is None:
        return None, f"cannot read gs://{bucket}/{name} without Google Cloud credentials"
    try:
        data = json.loads(storage.bucket(bucket).blob(name).download_as_bytes())
    except Exception as e:  # missing, no access, not JSON: the check says so
        first = (str(e).splitlines() or [""])[0][:160]
        return None, f"cannot read gs://{bucket}/{name} ({type(e).__name__}: {first})"
    if not isinstance(data, dict):
        return None, f"gs://{bucket}/{name} is not a JSON object"
    return data, None


def _unchecked(label: str, why: str) -> api.DeviceFit:
    return api.DeviceFit(target=label, checked=False, why_not=why)


def _run_child(
    spec: RunSpec,
    config: dict[str, Any],
    target: CompileTarget,
    engine: str,
    on_line: OnLine | None,
) -> api.DeviceFit:
    """``python -m rlctl.core.trainer.device_fit`` with the request on stdin: its
    progress lines to ``on_line``, its report (or error) from stdout."""
    request = {
        "spec": spec.model_dump(mode="json"),
        "config": config,
        "target": target.model_dump(mode="json"),
        "engine": engine,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", api.FIT_MODULE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **_CHILD_ENV},
    )
    other: list[str] = []  # the libraries' own stderr: shown only if the check fails

    def read_stderr() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.rstrip("\n")
            if line.startswith(api.FIT_PROGRESS):
                if on_line is not None:
                    on_line(line[len(api.FIT_PROGRESS) :])
            else:
                other.append(line)
                del other[:-40]

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(request))
        proc.stdin.close()
        out = proc.stdout.read()
        proc.wait()
    except BaseException:  # Ctrl-C: the compile stops with the plan
        proc.kill()
        proc.wait()
        raise
    reader.join(timeout=5)
    answer: dict[str, Any] | None = None
    try:
        answer = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    except ValueError:
        answer = None
    if answer is None:
        last = next((ln for ln in reversed(other) if ln.strip()), f"exit {proc.returncode}")
        return _unchecked(target.label, f"the compile for it failed ({last.strip()[:200]})")
    if "error" in answer:
        kinds: dict[str, type[RlctlError]] = {
            "ConfigError": ConfigError,
            "MissingDependencyError": MissingDependencyError,
        }
        raise kinds.get(answer.get("kind", ""), ConfigError)(answer["error"], answer.get("hint"))
    return api.DeviceFit.model_validate(answer)
