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


class TestBadRows:
    """A row that cannot be used is a ConfigError naming the file, the row and why."""

    def read(self, tmp_path, text: str | bytes, name: str = "d.jsonl"):
        f = tmp_path / name
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
        return read_problems(str(f), DataSpec(name="gsm8k", path=str(f)))

    def test_hashes_without_a_number(self, tmp_path):
        rows = [{"question": "a", "answer": "#### 1"}, {"question": "b", "answer": "so #### "}]
        with pytest.raises(ConfigError, match=r"d\.jsonl:2: no number after '####'") as e:
            self.read(tmp_path, "\n".join(json.dumps(r) for r in rows))
        assert "\n" not in e.value.message

    def test_hashes_followed_by_words(self, tmp_path):
        row = {"question": "a", "answer": "#### about seven"}
        with pytest.raises(ConfigError, match=r"d\.jsonl:1: .*'about seven'"):
            self.read(tmp_path, json.dumps(row))

    def test_plain_answer_that_is_not_a_number(self, tmp_path):
        with pytest.raises(ConfigError, match=r"d\.jsonl:1: answer 'seven' is not a number"):
            self.read(tmp_path, json.dumps({"question": "a", "answer": "seven"}))

    @pytest.mark.parametrize(("line", "kind"), [
        ('["a", 1]', "array"), ("7", "number"), ('"q"', "string"), ("null", "null"),
    ])
    def test_row_that_is_not_an_object(self, tmp_path, line, kind):
        good = json.dumps({"question": "a", "answer": 1})
        with pytest.raises(ConfigError, match=rf"d\.jsonl:3: a JSON {kind}, not an object"):
            self.read(tmp_path, f"{good}\n\n{line}\n")  # line numbers count blank lines

    def test_missing_answer_field_names_the_row(self, tmp_path):
        with pytest.raises(ConfigError, match=r"d\.jsonl:1: no field 'answer'"):
            self.read(tmp_path, json.dumps({"question": "a", "solution": "#### 1"}))

    def test_not_utf8(self, tmp_path):
        good = json.dumps({"question": "a", "answer": 1}).encode()
        bad = b'{"question": "caf\xe9", "answer": 2}'  # Latin-1
        with pytest.raises(ConfigError, match=r"d\.jsonl:2: not UTF-8 text \(byte 0xe9") as e:
            self.read(tmp_path, good + b"\n" + bad + b"\n")
        assert "\n" not in e.value.message and "UTF-8" in (e.value.hint or "")

    def test_utf8_with_bom_and_line_separator_in_a_string(self, tmp_path):
        row = json.dumps({"question": "a\u2028b", "answer": "#### 3"}, ensure_ascii=False)
        (p,) = self.read(tmp_path, b"\xef\xbb\xbf" + row.encode())
        assert (p.question, p.answer) == ("a\u2028b", "3")

    def test_directory_is_named_as_such(self, tmp_path):
        (tmp_path / "data").mkdir()
        with pytest.raises(ConfigError, match="is a directory, not a file"):
            read_problems(str(tmp_path / "data"), DataSpec())

    def test_not_a_parquet_file(self, tmp_path):
        pytest.importorskip("pyarrow")
        with pytest.raises(ConfigError, match=r"d\.parquet: not a readable parquet file"):
            self.read(tmp_path, "not parquet", name="d.parquet")

    def test_parquet_rows_are_numbered(self, tmp_path):
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        f = tmp_path / "d.parquet"
        pq.write_table(pa.table({"question": ["a", "b"], "answer": ["#### 1", "#### x"]}), f)
        with pytest.raises(ConfigError, match=r"d\.parquet: row 2: no number after '####'"):
            read_problems(str(f), DataSpec(name="gsm8k", path=str(f)))

    def test_bad_eval_file_through_load_source(self, tmp_path):
        train = tmp_path / "train.jsonl"
        train.write_text(json.dumps({"question": "a", "answer": 1}) + "\n")
        held = tmp_path / "test.jsonl"
        held.write_text(json.dumps({"question": "b", "answer": "#### ?"}) + "\n")
        spec = DataSpec(name="gsm8k", path=str(train), eval_path=str(held))
        with pytest.raises(ConfigError, match=r"test\.jsonl:1: no number"):
            load_source(spec, eval_size=1)
