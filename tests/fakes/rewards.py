"""Rewards a tiny random model can earn, so its gradients are not all zero."""


def digit_count(completion: str, gold: str) -> float:
    return float(sum(ch.isdigit() for ch in completion)) / 10.0
