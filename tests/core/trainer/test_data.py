import json

import pytest

from rlctl.core.config.models import DataSpec
from rlctl.core.errors import ConfigError
from rlctl.core.trainer.data import load_source, read_problems


class TestArithmetic:
    def test_batches_are_a_pure_function_of_step(self):
        a = load_source(DataSpec(seed=3), eval_size=16)
        b = load_source(DataSpec(seed=3), eval_size=16)
        assert a.batch(5, 4) == b.batch(5, 4)
        assert a.batch(5, 4) != a.batch(6, 4)

    def test_held_out_is_disjoint_from_training(self):
        src = load_source(DataSpec(), eval_size=64)
        held = {p.question for p in src.eval_set}
        assert len(held) == 64
        for step in range(200):
            assert not held & {p.question for p in src.batch(step, 4)}

    def test_answers_are_right(self):
        src = load_source(DataSpec(max_operand=20), eval_size=64)
        for p in src.eval_set:
            if p.question.startswith("What is"):
                a, op, b = p.question[len("What is "):-1].split()
                assert int(p.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))
            assert int(p.answer) >= 0


class TestFiles:
    def test_gsm8k_jsonl(self, tmp_path):
        f = tmp_path / "gsm8k.jsonl"
        rows = [{"question": f"q{i}", "answer": f"work\n#### {i * 10:,}"} for i in range(20)]
        f.write_text("\n".join(json.dumps(r) for r in rows))
        src = load_source(DataSpec(name="gsm8k", path=str(f)), eval_size=5)
        assert len(src.eval_set) == 5
        held = {p.question for p in src.eval_set}
        assert all(p.question not in held for p in src.batch(0, 10))
        assert {p.answer for p in src.eval_set} <= {str(i * 10) for i in range(20)}

    def test_plain_number_answers(self, tmp_path):
        f = tmp_path / "d.jsonl"
        f.write_text(json.dumps({"q": "two?", "a": 2}) + "\n")
        spec = DataSpec(name="jsonl", path=str(f), question_field="q", answer_field="a")
        assert read_problems(str(f), spec)[0].answer == "2"

    def test_missing_field_names_the_field(self, tmp_path):
        f = tmp_path / "d.jsonl"
        f.write_text(json.dumps({"prompt": "x", "answer": 1}) + "\n")
        with pytest.raises(ConfigError, match="no field 'question'"):
            read_problems(str(f), DataSpec(name="jsonl", path=str(f)))

    def test_bad_json_names_the_line(self, tmp_path):
        f = tmp_path / "d.jsonl"
        f.write_text('{"question": "a", "answer": 1}\n{oops\n')
        with pytest.raises(ConfigError, match=r"d.jsonl:2"):
            read_problems(str(f), DataSpec(name="jsonl", path=str(f)))

    def test_missing_file(self, tmp_path):
        with pytest.raises(ConfigError, match="does not exist"):
            read_problems(str(tmp_path / "nope.jsonl"), DataSpec())
