"""Run the wire-level GCP fake on its own, for scripts that drive the installed CLI.

    python -m tests.fakes.serve --port 0 --cluster rl --accelerator 'v6e-16 x2' \\
        --dcn-networks 2 --project p --region us-central1 --url-file "$tmp/fake.url" &

It seeds a RUNNING GKE cluster shaped as ``rlctl cluster create`` would have made
it (``tests/fakes/seed.py``), prints its URL (``http://127.0.0.1:PORT``) as one
line on stdout, writes it to ``--url-file`` (atomically, so a script polling for
the file never reads half a line), and serves until SIGTERM or SIGINT. Point the
CLI at it with ``RLCTL_API_ENDPOINT_OVERRIDES_<SERVICE>=URL`` for every service of
``rlctl.core.clients.SERVICES`` and ``RLCTL_AUTH_DISABLE_CREDENTIALS=true``.

Cloud Storage is only served with ``--gcs`` (or ``--bucket``): then a
fake-gcs-server (test extra) runs behind the fake. ``train --cluster --dry-run
--runs-dir gs://...`` never touches storage; without ``--runs-dir`` it looks the
run bucket up by label, which ``--bucket NAME`` seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.fakes.serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    p.add_argument("--project", default="p")
    p.add_argument("--region", default="us-central1")
    p.add_argument("--cluster", help="seed a RUNNING cluster of this name")
    p.add_argument(
        "--accelerator",
        "-a",
        action="append",
        default=None,
        help="its accelerator pools, as 'cluster create -a' takes them "
        "(repeatable; default 'v6e-16 x2')",
    )
    p.add_argument(
        "--dcn-networks", type=int, default=0, help="DCN networks attached to the accelerator pools"
    )
    p.add_argument(
        "--endpoint",
        default=None,
        help="the cluster's Kubernetes endpoint (default: an address nothing "
        "answers on; dry runs never call it)",
    )
    p.add_argument(
        "--gcs",
        action="store_true",
        help="serve Cloud Storage from a fake-gcs-server behind the fake",
    )
    p.add_argument("--bucket", help="seed the cluster's run bucket (implies --gcs)")
    p.add_argument("--url-file", type=Path, help="also write the URL to this file")
    args = p.parse_args(argv)
    if args.accelerator and not args.cluster:
        p.error("--accelerator needs --cluster")
    if args.bucket and not args.cluster:
        p.error("--bucket needs --cluster (it is found by the cluster's label)")
    return args


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tests.fakes.gcp_server import FakeGCP
    from tests.fakes.seed import DEFAULT_ENDPOINT, seed_bucket, seed_cluster

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with contextlib.ExitStack() as stack:
        gcs_url = None
        if args.gcs or args.bucket:
            from tests.fakes.gcs import fake_gcs_server

            gcs_url = stack.enter_context(fake_gcs_server())
        try:
            fake = FakeGCP(project=args.project, gcs_url=gcs_url).start(port=args.port)
        except OSError as e:
            print(f"serve: cannot listen on 127.0.0.1:{args.port}: {e}", file=sys.stderr)
            return 1
        stack.callback(fake.stop)
        if args.cluster:
            seed_cluster(
                fake,
                args.cluster,
                args.accelerator or ["v6e-16 x2"],
                dcn_networks=args.dcn_networks,
                region=args.region,
                endpoint=args.endpoint or DEFAULT_ENDPOINT,
            )
        if args.bucket:
            seed_bucket(fake, args.bucket, args.cluster, args.region)
        if args.url_file:
            write_atomically(args.url_file, fake.url + "\n")
        print(fake.url, flush=True)
        while not stop.wait(0.2):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
