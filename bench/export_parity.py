"""A trained run exported to Hugging Face safetensors, checked in transformers.

Exports RUN's latest complete checkpoint with ``rlctl checkpoint-convert --to hf
--verify``, loads it in ``transformers.AutoModelForCausalLM`` (float32), restores the
same checkpoint into rlctl's JAX model, and prints, for a few chat prompts, the
largest next-token logit difference and both argmaxes, then both greedy completions.
Needs the ``test`` extra (torch, transformers).

    python -m bench.export_parity runs/grpo-20261123-162107-39bf
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

PROMPTS = [
    "What is 17 + 25?",
    "Tom has 12 apples and gives away 5. How many apples are left?",
    "What is 40 - 13?",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a local run folder with a checkpoint")
    a = p.parse_args()

    import numpy as np
    import torch
    import transformers
    import yaml
    from tunix.generate import utils as gu

    from rlctl.core.config.models import RunSpec
    from rlctl.core.store.local import LocalRunStore
    from rlctl.core.trainer.checkpoint.checkpointing import Checkpoints
    from rlctl.core.trainer.data.prompts import chat_messages
    from rlctl.core.trainer.run.loop import Trainer

    run = a.run.resolve()
    hf_dir = Path(tempfile.mkdtemp()) / "hf"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "rlctl",
            "checkpoint-convert",
            str(run),
            str(hf_dir),
            "--to",
            "hf",
            "--verify",
        ],
        check=True,
    )
    spec = RunSpec.model_validate(yaml.safe_load((run / "spec.yaml").read_text()))
    store_run = LocalRunStore(str(run.parent)).run(run.name)
    t = Trainer(spec, store_run)
    t.create_model()
    t.create_optimizer()
    ckpt = Checkpoints(store_run, t.topo, spec.checkpoint.keep, warn=print)
    step = ckpt.restore_latest(t.model, t.optimizer)
    ckpt.close()
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    tok = t.tokenizer
    worst = 0.0
    for q in PROMPTS:
        x = np.array([tok.encode(tok.apply_chat_template(chat_messages(q)))], np.int32)
        mask = np.ones_like(x, bool)
        logits, _ = t.model(
            x, gu.build_positions_from_mask(mask), None, gu.make_causal_attn_mask(mask, x.shape[1])
        )
        ours = np.asarray(logits[0, -1], np.float32)
        with torch.no_grad():
            theirs = hf(torch.tensor(x, dtype=torch.long)).logits[0, -1].numpy()
        diff = float(np.abs(ours - theirs).max())
        worst = max(worst, diff)
        print(
            f"{q[:40]:40} max |logit diff| {diff:.2e}  argmax {ours.argmax()} / {theirs.argmax()}"
        )
    prompt = tok.apply_chat_template(chat_messages(PROMPTS[0]))
    ours_text = t.rollout.sample([prompt], width=len(tok.encode(prompt)), seed=0, greedy=True).text[
        0
    ]
    ids = tok.encode(prompt)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=spec.rollout.max_new_tokens,
            do_sample=False,
            eos_token_id=tok.eos_ids,
        )
    theirs_text = tok.decode([i for i in out[0, len(ids) :].tolist() if i not in tok.eos_ids])
    print(f"step {step}; worst logit difference {worst:.2e}")
    print(f"rlctl greedy:        {ours_text!r}")
    print(f"transformers greedy: {theirs_text!r}")
    print("same greedy completion:", ours_text.strip() == theirs_text.strip())


if __name__ == "__main__":
    main()
