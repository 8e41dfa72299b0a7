"""Prompt construction: a system instruction plus one worked example.

Measured on SmolLM2-135M-Instruct: with the instruction alone it never writes
``<answer>`` tags (0/64), every reward is 0 and GRPO has nothing to learn from;
with one demonstration turn it answers in tags most of the time.
"""

from __future__ import annotations

SYSTEM = (
    "You are a careful math assistant. Solve the problem, then give the final answer "
    "as a number inside <answer></answer> tags."
)
DEMO_QUESTION = "What is 4 + 3?"
DEMO_ANSWER = "4 + 3 = 7. <answer>7</answer>"


def chat_messages(question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": DEMO_QUESTION},
        {"role": "assistant", "content": DEMO_ANSWER},
        {"role": "user", "content": question},
    ]
