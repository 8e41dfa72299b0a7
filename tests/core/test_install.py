"""The install hint names where this rlctl came from (rlctl is not on PyPI): pip's
``direct_url.json`` of the distribution, as ``core/install.py`` reads it."""

from __future__ import annotations

import importlib.metadata as im
import json

import pytest

from rlctl.core import install
from rlctl.core.errors import MissingDependencyError, require_extra


class FakeDist:
    def __init__(self, direct_url: dict | None) -> None:
        self.text = None if direct_url is None else json.dumps(direct_url)

    def read_text(self, name: str) -> str | None:
        return self.text if name == "direct_url.json" else None


@pytest.fixture
def installed(monkeypatch):
    def as_(direct_url: dict | None) -> None:
        monkeypatch.setattr(im, "distributions", lambda name: [FakeDist(direct_url)])

    return as_


@pytest.mark.parametrize(
    ("direct_url", "command"),
    [
        (
            {"url": "file:///home/me/src/rl%20ctl", "dir_info": {"editable": True}},
            "pip install -e '/home/me/src/rl ctl[gcp]'",
        ),
        ({"url": "file:///tmp/rlctl", "dir_info": {}}, "pip install '/tmp/rlctl[gcp]'"),
        (
            {"url": "file:///w/rlctl-0.1.0-py3-none-any.whl", "archive_info": {}},
            "pip install '/w/rlctl-0.1.0-py3-none-any.whl[gcp]'",
        ),
        (
            {"url": "https://github.com/o/rlctl", "vcs_info": {"vcs": "git", "commit_id": "abc"}},
            "pip install 'rlctl[gcp] @ git+https://github.com/o/rlctl@abc'",
        ),
        (None, "pip install 'rlctl[gcp]'"),  # from an index: no direct_url.json
    ],
    ids=["editable", "folder", "wheel", "git", "index"],
)
def test_extra_install_command_follows_the_install(installed, direct_url, command):
    installed(direct_url)
    assert install.extra_install_command("gcp") == command


def test_missing_extra_in_an_editable_install_names_the_source_folder(installed):
    installed({"url": "file:///home/me/rlctl", "dir_info": {"editable": True}})
    with pytest.raises(MissingDependencyError) as e:
        require_extra("rlctl_no_such_module", "k8s")
    assert e.value.hint == "pip install -e '/home/me/rlctl[k8s]'"


def test_a_checkouts_egg_info_does_not_hide_the_installed_metadata(monkeypatch):
    """Run from the checkout, setuptools' rlctl.egg-info (no direct_url.json) is
    found first on sys.path: the hint still comes from the installed dist-info."""
    monkeypatch.setattr(
        im,
        "distributions",
        lambda name: [
            FakeDist(None),
            FakeDist({"url": "file:///home/me/rlctl", "dir_info": {"editable": True}}),
        ],
    )
    assert install.extra_install_command("plot") == "pip install -e '/home/me/rlctl[plot]'"


def test_not_installed_at_all(monkeypatch):
    monkeypatch.setattr(im, "distributions", lambda name: [])
    assert install.extra_install_command("train") == "pip install 'rlctl[train]'"
    assert install.self_install_command().startswith("pip install -e ")
