"""Rewards a tiny random model can earn, so its gradients are not all zero."""


def digit_count(completion: str, gold: str) -> float:
    return float(sum(ch.isdigit() for ch in completion)) / 10.0


def paced_digit_count(completion: str, gold: str) -> float:
    """``digit_count``, 0.25 s slower a completion while the file named by
    ``RLCTL_TEST_PACE`` exists: a test holds a fast run's steps at a pace it can act
    between (a host added, another killed), then lets it finish at full speed."""
    import os
    import time

    pace = os.environ.get("RLCTL_TEST_PACE")
    if pace and os.path.exists(pace):
        time.sleep(0.25)
    return digit_count(completion, gold)
