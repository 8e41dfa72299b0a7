"""Estimated node-pool cost per hour from the dated price table in ``rlctl/data/prices.yaml``.

An estimate only: public list prices for one region, no discounts. The plan shows
the table's date and this caveat next to every figure.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from rlctl.core.config.catalog import Accelerator

Capacity = str  # "on-demand" | "spot" | "reservation"


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return yaml.safe_load(resources.files("rlctl").joinpath("data/prices.yaml").read_text())


def _rate(entry: dict[str, Any] | None, capacity: Capacity) -> float | None:
    if not entry:
        return None
    # Reservations are billed at the on-demand rate (less any commitment discount).
    return entry.get("spot" if capacity == "spot" else "on-demand")


def machine_hour(machine_type: str, capacity: Capacity = "on-demand") -> float | None:
    return _rate(table()["machine_hour"].get(machine_type), capacity)


def pool_hour(acc: Accelerator, nodes: int, capacity: Capacity = "on-demand") -> float | None:
    """Estimated USD/hour for ``nodes`` machines of ``acc`` (None if not in the table)."""
    prices, key, per_node = acc.strategy.price_key(acc)  # TPU: per chip; GPU: per machine
    rate = _rate(table()[prices].get(key), capacity)
    return None if rate is None else round(rate * per_node * nodes, 2)


def caveat(region: str | None = None) -> str:
    """The caveat shown next to a plan's cost. The table holds one region's prices:
    a plan elsewhere names its own region first, and says whose prices it used."""
    t = table()
    source = f"{t['currency']}, as of {t['as_of']}; excludes discounts, storage and network"
    if region is None or region == t["region"]:
        return f"estimate from public list prices ({t['region']}, {source})"
    return (
        f"estimate for {region} from {t['region']} public list prices ({source}; "
        f"prices in {region} may differ)"
    )
