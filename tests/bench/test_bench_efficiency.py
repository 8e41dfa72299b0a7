"""bench/bench_efficiency.py on the tiny model: the bytes it counts per decoded token
are the sampler's real weights and KV cache, and its fractions are the measured
figure over the measured limit."""

from __future__ import annotations

import pytest

from bench import bench_efficiency as be

# builds a model, compiles or trains: out of the fast loop (tests/test_marks.py)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def figures(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eff") / "eff.json"
    return be.main(
        [
            "--set",
            f"model.source={tiny_model_dir}",
            "--new-tokens",
            "48",
            "--repeats",
            "3",
            "-o",
            str(out),
        ]
    ), out


def test_the_bytes_per_token_are_the_samplers_weights_and_the_cache_it_reads(
    figures, tiny_model_dir
):
    import jax

    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter.llama import decode

    r = figures[0]["rollout"]
    model, info = ta.load_model(tiny_model_dir, compute_dtype=r["compute_dtype"])
    # what a decode step reads: its laid-out weights in the run's compute dtype (the
    # embedding a row per row only)
    laid = decode.weights(model, info.compute_dtype)
    weights = sum(x.nbytes for k, v in laid.items() if k != "emb" for x in jax.tree.leaves(v))
    assert weights == sum(x.nbytes for x in jax.tree.leaves(laid)) - laid["emb"].nbytes

    def kv_bytes(rows, slots):
        cache = ta.kv_cache(info, rows, slots)
        return sum(layer["k"].nbytes + layer["v"].nbytes for layer in cache.values())

    # weights first (decode.py), the prompt's slots are read once per prompt and each
    # row's completion slots once per row
    assert r["shared_prompt_slots"] and r["prompts"] == 2
    kv = kv_bytes(r["prompts"], r["prompt_slots"]) + kv_bytes(
        r["rows"], r["cache_slots"] - r["prompt_slots"]
    )
    assert kv < kv_bytes(r["rows"], r["cache_slots"])
    assert r["rows"] == 16  # the default batch: 2 prompts x G=8
    assert r["weight_bytes"] == weights
    assert r["cache_bytes"] == kv
    assert r["bytes_per_token"] == weights + kv


def test_the_fractions_are_the_achieved_figures_over_the_measured_limits(figures):
    out, path = figures
    r, u = out["rollout"], out["update"]
    assert r["seconds_per_token"] > 0 and u["seconds"] > 0
    achieved = r["bytes_per_token"] / r["seconds_per_token"] / 1e9
    assert r["achieved_GBps"] == pytest.approx(achieved, abs=0.01)
    assert r["fraction_of_bandwidth"] == pytest.approx(
        achieved / r["read_bandwidth_GBps"], rel=0.02, abs=1e-3
    )
    xla = u["xla_flops"] / u["seconds"] / 1e9
    assert u["xla_flops"] > u["useful_flops"] > 0  # the backward pass and the softmax count too
    assert u["fraction_of_matmul_rate"] == pytest.approx(
        xla / u["matmul_GFLOPs"], rel=0.02, abs=1e-3
    )
    assert path.read_text().startswith("{")


def test_the_decode_says_which_limit_binds(figures, tiny_model_dir):
    """FLOPs per step: a multiply-add per row per multiplied weight (projections and
    head, not norms) and the attention's two products over every slot; against the
    machine's matmul rate per byte of bandwidth, the most of it a step could use."""
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter.llama import decode

    r = figures[0]["rollout"]
    model, info = ta.load_model(tiny_model_dir, compute_dtype=r["compute_dtype"])
    laid = decode.weights(model, info.compute_dtype)
    products = laid["head"].size + sum(
        v.size for layer in laid["layers"] for k, v in layer.items() if k not in ("ln1", "ln2")
    )
    attention = (
        4 * info.num_layers * r["rows"] * model.config.num_heads * info.head_dim * r["cache_slots"]
    )
    assert r["flops_per_token"] == 2 * r["rows"] * products + attention
    intensity = r["flops_per_token"] / r["bytes_per_token"]
    balance = r["matmul_GFLOPs"] / r["read_bandwidth_GBps"]
    assert r["flops_per_byte"] == pytest.approx(intensity, abs=0.01)
    assert r["machine_flops_per_byte"] == pytest.approx(balance, rel=0.02)
    # the figures are printed to three decimals: half of the last digit is within tolerance
    assert r["bandwidth_ceiling"] == pytest.approx(
        min(1.0, balance / intensity), rel=0.02, abs=1e-3
    )
    assert r["fraction_of_matmul_rate"] == pytest.approx(
        r["flops_per_token"] / r["seconds_per_token"] / 1e9 / r["matmul_GFLOPs"], rel=0.02, abs=1e-3
    )


def test_the_decode_times_its_products_alone(figures, tiny_model_dir):
    """The products the bench times alone are the ones a decode step multiplies by
    (every laid-out projection and the head: the step's weights less its norms), and
    its rate, share and verdict are those seconds over the same step and bandwidth."""
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter.llama import decode

    r = figures[0]["rollout"]
    model, info = ta.load_model(tiny_model_dir, compute_dtype=r["compute_dtype"])
    laid = decode.weights(model, info.compute_dtype)
    norms = sum(layer[k].nbytes for layer in laid["layers"] for k in ("ln1", "ln2"))
    norms += laid["norm"].nbytes
    assert r["product_bytes"] == r["weight_bytes"] - norms
    assert r["product_bytes"] == laid["head"].nbytes + sum(
        x.nbytes for layer in laid["layers"] for k, x in layer.items() if k not in ("ln1", "ln2")
    )
    assert r["quarter_rows"] == r["rows"] // 4
    assert r["product_seconds"] > 0 and r["product_seconds_quarter_rows"] > 0
    streamed = r["product_bytes"] / r["product_seconds"] / 1e9
    assert r["product_GBps"] == pytest.approx(streamed, abs=0.01)
    assert r["product_fraction_of_bandwidth"] == pytest.approx(
        streamed / r["read_bandwidth_GBps"], rel=0.02, abs=1e-3
    )
    assert r["product_share_of_step"] == pytest.approx(
        r["product_seconds"] / r["seconds_per_token"], rel=0.01, abs=1e-3
    )
    thin = r["product_seconds_quarter_rows"] > 0.8 * r["product_seconds"]
    assert r["product_bound_by"] == ("streaming" if thin else "flops")


def test_the_products_program_multiplies_as_the_decode_does(tiny_model_dir):
    """Its products read the sampler's dtype as the decode step's do: sampling in
    bfloat16, every one of them is a dot of bfloat16 inputs in the compiled program
    (none turned back to float32, test_mixed.py's pitfalls), one per laid-out
    projection and the head; sampling in float32, none is."""
    import numpy as np

    from tests.core.trainer.test_mixed import narrow_dots

    for dtype, narrow in (("bfloat16", True), ("float32", False)):
        t = be.trainer(
            [
                f"model.source={tiny_model_dir}",
                f"rollout.compute_dtype={dtype}",
                "model.compute_dtype=float32",
            ]
        )
        products, mats, inputs = be.decode_products(t)
        assert len(mats) == 4 * t.info.num_layers + 1
        assert {str(w.dtype) for w in mats} == {dtype}
        text = products.lower(mats, inputs(16)).compile().as_text()
        assert narrow_dots(text) == (len(mats) if narrow else 0, len(mats))
        assert np.isfinite(float(products(mats, inputs(4))))
