"""The Contributing part of the docs holds: its lists are the registries', and each
template file works as it stands (the backend template runs in tests/core/k8s/test_backends.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "contributing"
TEMPLATES = PAGES / "templates"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_registered_lists_are_the_registries():
    gen = _load(ROOT / "tools" / "gen_contributing.py", "gen_contributing")
    text = (PAGES / "index.md").read_text()
    assert gen.rewrite(text) == text, (
        "docs/contributing/index.md's lists are stale: "
        "python tools/gen_contributing.py docs/contributing/index.md"
    )


def test_a_new_backend_shows_in_the_generated_list():
    from rlctl.core.k8s import backends

    gen = _load(ROOT / "tools" / "gen_contributing.py", "gen_contributing")
    job = _load(TEMPLATES / "backend" / "__init__.py", "backend_template").JobBackend()
    backends.register(job)
    try:
        assert "`job` (Job)" in gen.lists()
    finally:
        backends.unregister("job")
    assert "`job` (Job)" not in gen.lists()


def test_every_template_is_linked_from_its_page():
    pages = "\n".join(p.read_text() for p in PAGES.glob("*.md"))
    for t in ("reward.py", "family.py", "kind.py", "backend/__init__.py"):
        assert f"templates/{t}" in pages or f"templates/{t.split('/')[0]}/" in pages, t


def test_the_reward_template_loads_and_scores_as_a_run_would():
    from rlctl.core.trainer.rewards.loading import resolve

    (reward,) = resolve([f"{TEMPLATES / 'reward.py'}:has_units"])
    assert (reward.name, reward.batched) == ("has_units", False)
    assert reward.fn("She pays 12 dollars.", "12") == 1.0
    assert reward.fn("The answer is 12.", "12") == 0.0


def test_the_family_template_is_a_family_that_maps_a_llama_config():
    from rlctl.core.families.record import Family

    fam = _load(TEMPLATES / "family.py", "family_template").FAMILY
    assert isinstance(fam, Family) and fam.model_type == "my_decoder"
    config = {
        "model_type": "my_decoder",
        "num_hidden_layers": 2,
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    }
    fields = fam.config_fields(config)
    assert (fields["num_layers"], fields["num_heads"], fields["head_dim"]) == (2, 4, 16)


def test_the_kind_template_is_a_kind_that_shapes_a_gpu_machine():
    from rlctl.core.config.catalog import lookup
    from rlctl.core.config.kinds import AcceleratorKind

    kind = _load(TEMPLATES / "kind.py", "kind_template").MyAccelerator()
    assert isinstance(kind, AcceleratorKind)
    acc = lookup("a3-highgpu-8g")
    assert kind.shape_fields(acc, 2) == {
        "accelerator": "nvidia-h100-80gb",
        "hosts_per_slice": 2,
        "chips_per_host": 8,
    }
    assert kind.pool_sizes(acc, 2) == [2] and kind.threads(acc) is None
    assert kind.node_labels(acc) == {"example.com/accelerator-type": "nvidia-h100-80gb"}
    assert kind.resource == "example.com/accelerator" and kind.name == "myacc"


@pytest.mark.parametrize(
    "page", ["families.md", "backends.md", "accelerator-kinds.md", "rewards.md"]
)
def test_each_page_names_the_test_that_holds_it(page):
    text = (PAGES / page).read_text()
    assert "tests/" in text and "templates/" in text
