import csv
import json
import re

import pytest

from rlctl.core.config.models import DataSpec
from rlctl.core.errors import ConfigError
from rlctl.core.trainer.data import load_source, read_problems


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def gsm8k_rows(n: int, prefix: str = "q") -> list[dict]:
    return [{"question": f"{prefix}{i}", "answer": f"work\n#### {i * 10:,}"} for i in range(n)]


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
                a, op, b = p.question[len("What is ") : -1].split()
                assert int(p.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))
            assert int(p.answer) >= 0

    def test_columns_are_the_question_and_the_answer(self):
        (p,) = load_source(DataSpec(), eval_size=1).eval_set
        assert p.columns == {"question": p.question, "answer": p.answer}
        assert p.messages is None


class TestFiles:
    def test_gsm8k_jsonl(self, tmp_path):
        f = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_rows(40))
        src = load_source(DataSpec(path=f), eval_size=5)
        assert len(src.eval_set) == 5 and not src.notes
        held = {p.question for p in src.eval_set}
        assert all(p.question not in held for p in src.batch(0, 10))
        assert {p.answer for p in src.eval_set} <= {str(i * 10) for i in range(40)}

    def test_plain_number_answers_and_the_old_field_names(self, tmp_path):
        f = write_jsonl(tmp_path / "d.jsonl", [{"q": "two?", "a": 2}])
        spec = DataSpec(name="jsonl", path=f, question_field="q", answer_field="a")
        assert (spec.dataset, spec.prompt_column, spec.answer_column) == (None, "q", "a")
        (p,) = read_problems(f, spec)
        assert (p.question, p.answer, p.columns) == ("two?", "2", {"q": "two?", "a": 2})

    def test_a_named_column_the_file_lacks(self, tmp_path):
        f = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x", "answer": 1}])
        with pytest.raises(
            ConfigError,
            match=r"data.prompt_column='question' is not a column "
            r"of data file '.*d\.jsonl' \(its columns: prompt, answer\)",
        ):
            read_problems(f, DataSpec(path=f, prompt_column="question"))

    def test_a_row_without_the_column(self, tmp_path):
        f = write_jsonl(
            tmp_path / "d.jsonl", [{"question": "a", "answer": 1}, {"question": "b", "solution": 1}]
        )
        with pytest.raises(ConfigError, match=r"d\.jsonl:2: no field 'answer'"):
            read_problems(f, DataSpec(path=f))

    def test_bad_json_names_the_line(self, tmp_path):
        f = tmp_path / "d.jsonl"
        f.write_text('{"question": "a", "answer": 1}\n{oops\n')
        with pytest.raises(ConfigError, match=r"d.jsonl:2"):
            read_problems(str(f), DataSpec(path=str(f)))

    def test_missing_file(self, tmp_path):
        with pytest.raises(ConfigError, match="does not exist"):
            read_problems(str(tmp_path / "nope.jsonl"), DataSpec())

    def test_empty_file(self, tmp_path):
        f = tmp_path / "d.jsonl"
        f.write_text("\n")
        with pytest.raises(ConfigError, match="has no rows"):
            read_problems(str(f), DataSpec(path=str(f)))


ROWS = [{"question": "one?", "answer": "#### 1"}, {"question": "two?", "answer": "2"}]


class TestFormats:
    """The same rows in every format read as the same problems; the format comes from
    the extension, else the content."""

    def write(self, tmp_path, kind: str):
        if kind == "parquet":
            pa = pytest.importorskip("pyarrow")
            import pyarrow.parquet as pq

            f = tmp_path / "d.parquet"
            pq.write_table(pa.Table.from_pylist(ROWS), f)
            return f
        f = tmp_path / {
            "csv": "d.csv",
            "tsv": "d.tsv",
            "no-extension-jsonl": "data",
            "no-extension-json": "data",
        }.get(kind, "d.json")
        if kind in ("csv", "tsv"):
            with f.open("w", newline="") as out:
                w = csv.DictWriter(
                    out, ["question", "answer"], delimiter="\t" if kind == "tsv" else ","
                )
                w.writeheader()
                w.writerows(ROWS)
        elif kind in ("jsonl-as-json", "no-extension-jsonl"):
            write_jsonl(f, ROWS)
        elif kind == "wrapped":
            f.write_text(json.dumps({"data": ROWS}))
        elif kind == "columnar":
            f.write_text(json.dumps({k: [r[k] for r in ROWS] for k in ROWS[0]}))
        else:
            f.write_text(json.dumps(ROWS, indent=2))
        return f

    @pytest.mark.parametrize(
        "kind",
        [
            "json",
            "wrapped",
            "columnar",
            "jsonl-as-json",
            "parquet",
            "csv",
            "tsv",
            "no-extension-jsonl",
            "no-extension-json",
        ],
    )
    def test_format(self, tmp_path, kind):
        f = str(self.write(tmp_path, kind))
        got = [(p.question, p.answer) for p in read_problems(f, DataSpec(path=f))]
        assert got == [("one?", "1"), ("two?", "2")]

    def test_parquet_without_its_extension(self, tmp_path):
        f = self.write(tmp_path, "parquet")
        f = f.rename(tmp_path / "blob")
        assert len(read_problems(str(f), DataSpec(path=str(f)))) == 2

    def test_unknown_content_is_refused_naming_the_formats(self, tmp_path):
        f = tmp_path / "notes.txt"
        f.write_text("question answer\n")
        with pytest.raises(ConfigError, match="cannot tell its format") as e:
            read_problems(str(f), DataSpec(path=str(f)))
        assert "JSONL, JSON, Parquet or CSV" in (e.value.hint or "")

    def test_a_json_document_that_is_no_list_of_rows(self, tmp_path):
        f = tmp_path / "d.json"
        f.write_text('{"question": "a", "n": 3}')
        with pytest.raises(ConfigError, match="not a list of rows"):
            read_problems(str(f), DataSpec(path=str(f)))

    def test_csv_rows_are_numbered_by_line(self, tmp_path):
        f = tmp_path / "d.csv"
        f.write_text("question,answer\na,1\n\nb,x\n")
        with pytest.raises(ConfigError, match=r"d\.csv:4: answer 'x' is neither a number"):
            read_problems(str(f), DataSpec(path=str(f)))


class TestColumns:
    """What a TRL user's data looks like (trl docs/source/dataset_formats.md: standard
    and conversational prompt-only / prompt-completion rows, SFT 'messages' rows)."""

    def read(self, tmp_path, rows, **spec):
        f = write_jsonl(tmp_path / "d.jsonl", rows)
        return read_problems(f, DataSpec(path=f, **spec))

    def test_prompt_and_solution(self, tmp_path):
        (p,) = self.read(tmp_path, [{"prompt": "2+2?", "solution": "4", "level": 1}])
        assert (p.question, p.answer, p.messages) == ("2+2?", "4", None)
        assert p.columns == {"prompt": "2+2?", "solution": "4", "level": 1}

    def test_problem_and_ground_truth(self, tmp_path):
        (p,) = self.read(tmp_path, [{"problem": "3+3?", "ground_truth": 6}])
        assert (p.question, p.answer) == ("3+3?", "6")

    def test_custom_column_names(self, tmp_path):
        (p,) = self.read(
            tmp_path,
            [{"instr": "1+1?", "gold": "#### 2", "answer": "no"}],
            prompt_column="instr",
            answer_column="gold",
        )
        assert (p.question, p.answer) == ("1+1?", "2")

    def test_chat_messages_with_the_answer_as_the_assistant_turn(self, tmp_path):
        msgs = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "5+5?"},
            {"role": "assistant", "content": "#### 10"},
        ]
        (p,) = self.read(tmp_path, [{"messages": msgs}])
        assert (p.question, p.answer) == ("5+5?", "10")
        assert p.messages == tuple(msgs[:2])  # the reference reply is not in the prompt

    def test_conversational_prompt_and_an_answer_column(self, tmp_path):
        prompt = [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "7+1?"},
        ]
        (p,) = self.read(tmp_path, [{"prompt": prompt, "answer": 8}])
        assert (p.question, p.answer, p.messages) == ("7+1?", "8", tuple(prompt))

    def test_a_chat_whose_last_turn_is_the_users_needs_an_answer_column(self, tmp_path):
        with pytest.raises(
            ConfigError,
            match=r"d\.jsonl:1: the conversation's last turn is "
            "the user's",
        ):
            self.read(tmp_path, [{"messages": [{"role": "user", "content": "hi"}]}])

    def test_a_chat_without_a_user_turn(self, tmp_path):
        msgs = [{"role": "system", "content": "s"}, {"role": "assistant", "content": "1"}]
        with pytest.raises(ConfigError, match="has no user turn"):
            self.read(tmp_path, [{"messages": msgs}])

    def test_no_usable_columns_names_them_and_the_settings(self, tmp_path):
        with pytest.raises(ConfigError) as e:
            self.read(tmp_path, [{"text": "hi", "label_x": 1}, {"text": "yo", "extra": 2}])
        msg = e.value.message
        assert "has no prompt column (its columns: text, label_x, extra;" in msg
        assert "data.prompt_column" in msg and "data.answer_column" in msg
        assert "\n" not in msg

    def test_no_answer_column_names_the_setting(self, tmp_path):
        with pytest.raises(
            ConfigError,
            match=r"has no answer column \(its columns: prompt, "
            r"output; .*set data.answer_column",
        ):
            self.read(tmp_path, [{"prompt": "hi", "output": "1"}])

    def test_a_prompt_that_is_neither_text_nor_a_chat(self, tmp_path):
        with pytest.raises(ConfigError, match=r"d\.jsonl:1: 'prompt' holds a number"):
            self.read(tmp_path, [{"prompt": 3, "answer": 1}])


class TestHeldOut:
    def test_a_small_file_holds_out_a_fifth_and_says_so(self, tmp_path):
        f = write_jsonl(tmp_path / "d.jsonl", gsm8k_rows(20))
        src = load_source(DataSpec(path=f), eval_size=64)
        assert len(src.eval_set) == 4 and len(src.every_train()) == 16
        (note,) = src.notes
        assert "has 20 rows: holding out 4 for eval, not eval.size=64" in note
        assert "data.eval_path" in note and "\n" not in note

    def test_no_eval_holds_nothing_out(self, tmp_path):
        f = write_jsonl(tmp_path / "d.jsonl", gsm8k_rows(3))
        src = load_source(DataSpec(path=f), eval_size=0)
        assert (src.eval_set, len(src.every_train()), src.notes) == ([], 3, ())

    def test_one_row_cannot_be_split(self, tmp_path):
        f = write_jsonl(tmp_path / "d.jsonl", gsm8k_rows(1))
        with pytest.raises(ConfigError, match="has 1 row: none can be held out") as e:
            load_source(DataSpec(path=f), eval_size=4)
        assert "--eval-size 0" in (e.value.hint or "")

    def test_an_eval_file_is_the_held_out_set(self, tmp_path):
        train = write_jsonl(tmp_path / "train.jsonl", gsm8k_rows(6))
        test = write_jsonl(tmp_path / "test.jsonl", gsm8k_rows(8, prefix="t"))
        src = load_source(DataSpec(path=train, eval_path=test), eval_size=5)
        assert [p.question for p in src.eval_set] == ["t0", "t1", "t2", "t3", "t4"]
        assert len(src.every_train()) == 6 and not src.notes

    def test_an_eval_file_of_the_training_questions(self, tmp_path):
        train = write_jsonl(tmp_path / "train.jsonl", gsm8k_rows(3))
        with pytest.raises(
            ConfigError, match="every training question of .* is also a held-out question"
        ):
            load_source(DataSpec(path=train, eval_path=train), eval_size=5)


class TestDataSpec:
    def test_the_default_is_the_generator(self):
        assert DataSpec().dataset == "arithmetic"

    def test_a_path_alone_selects_the_file(self):
        assert DataSpec(path="t.jsonl").dataset is None

    def test_gsm8k_is_openai_gsm8k_main_with_its_test_split(self):
        s = DataSpec(dataset="gsm8k")
        assert (s.hub_id, s.config, s.split, s.eval_split) == (
            "openai/gsm8k",
            "main",
            "train",
            "test",
        )

    def test_a_hub_id_with_its_config_and_splits(self):
        s = DataSpec(dataset="AI-MO/NuminaMath-TIR", split="train", eval_split="test")
        assert (s.hub_id, s.config, s.eval_split) == ("AI-MO/NuminaMath-TIR", None, "test")

    def test_a_hub_dataset_with_a_local_copy_reads_the_copy(self):
        s = DataSpec(dataset="gsm8k", path="train.jsonl")
        assert s.hub_id is None and s.eval_split is None

    @pytest.mark.parametrize(
        ("spec", "words"),
        [
            ({"dataset": "arithmetic", "path": "t.jsonl"}, "generated and takes no path"),
            ({"dataset": "imagenet"}, "not 'arithmetic', 'gsm8k' or a hub dataset id"),
            ({"dataset": "./t.jsonl"}, "is a path: a file on this machine is --data-path"),
            ({"path": "t.jsonl", "eval_split": "test"}, "give the eval file as data.eval_path"),
            ({"path": "t.jsonl", "split": "test"}, "the whole file is the training data"),
            ({"name": "jsonl"}, "reads data.path"),
            ({"name": "gsm8k", "dataset": "openai/gsm8k"}, "old name of data.dataset"),
        ],
    )
    def test_refused(self, spec, words):
        with pytest.raises(ValueError, match=words):
            DataSpec(**spec)


class TestBadRows:
    """A row that cannot be used is a ConfigError naming the file, the row and why."""

    def read(self, tmp_path, text: str | bytes, name: str = "d.jsonl"):
        f = tmp_path / name
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
        return read_problems(str(f), DataSpec(dataset="gsm8k", path=str(f)))

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
        with pytest.raises(ConfigError, match=r"d\.jsonl:1: answer 'seven' is neither a number"):
            self.read(tmp_path, json.dumps({"question": "a", "answer": "seven"}))

    @pytest.mark.parametrize(
        ("line", "kind"),
        [
            ('["a", 1]', "array"),
            ("7", "number"),
            ('"q"', "string"),
            ("null", "null"),
        ],
    )
    def test_row_that_is_not_an_object(self, tmp_path, line, kind):
        good = json.dumps({"question": "a", "answer": 1})
        with pytest.raises(ConfigError, match=rf"d\.jsonl:3: a JSON {kind}, not an object"):
            self.read(tmp_path, f"{good}\n\n{line}\n")  # line numbers count blank lines

    def test_no_row_is_an_object(self, tmp_path):
        with pytest.raises(ConfigError, match=r"d\.jsonl:1: a JSON array, not an object"):
            self.read(tmp_path, '["a", 1]\n')

    def test_an_empty_answer_names_the_row(self, tmp_path):
        with pytest.raises(ConfigError, match=r"d\.jsonl:1: 'answer' is empty"):
            self.read(tmp_path, json.dumps({"question": "a", "answer": None}))

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
            read_problems(str(f), DataSpec(path=str(f)))

    def test_bad_eval_file_through_load_source(self, tmp_path):
        train = tmp_path / "train.jsonl"
        train.write_text(json.dumps({"question": "a", "answer": 1}) + "\n")
        held = tmp_path / "test.jsonl"
        held.write_text(json.dumps({"question": "b", "answer": "#### ?"}) + "\n")
        spec = DataSpec(path=str(train), eval_path=str(held))
        with pytest.raises(ConfigError, match=r"test\.jsonl:1: no number"):
            load_source(spec, eval_size=1)


class TestCsvFields:
    """#47: a line with more or fewer fields than the header, or bad quoting, is one
    line naming it (an unquoted comma shifted the answer into another column, or an
    unclosed quote ran to the end of the file and its rows read as "empty")."""

    @pytest.mark.parametrize(
        ("text", "words"),
        [
            ("question,answer\na,1,surplus\n", "d.csv:2: 3 fields, but the header names 2"),
            ("question,answer\nWhat is 1,000 + 2?,1002\n", "d.csv:2: 3 fields"),
            ("question,answer\na,1\nb\n", "d.csv:3: 1 field, but the header names 2"),
            (
                'question,answer\n"a,1\nb,2\n',
                "d.csv:2: a quoted field opened on line 2 is never closed",
            ),
            ('question,answer\n"a "b" c",1\n', "d.csv:2: not valid CSV"),
        ],
    )
    def test_fields_that_do_not_match_the_header_are_named(self, tmp_path, text, words):
        f = tmp_path / "d.csv"
        f.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(words)) as e:
            read_problems(str(f), DataSpec(path=str(f)))
        assert "quoted" in (e.value.hint or "")

    def test_quoted_fields_with_commas_quotes_and_line_breaks_read(self, tmp_path):
        f = tmp_path / "d.csv"
        f.write_text('question,answer\n"What is 1,000 + ""2""\nplus 0?",1002\nb,3\n')
        p, q = read_problems(str(f), DataSpec(path=str(f)))
        assert p.question == 'What is 1,000 + "2"\nplus 0?' and p.answer == "1002"
        assert p.where.endswith("d.csv:2") and q.where.endswith("d.csv:4")

    def test_a_field_past_the_csv_modules_limit_is_read_whole(self, tmp_path):
        f = tmp_path / "d.csv"
        f.write_text(f"question,answer\n{'x' * 200_000},1\n")
        (p,) = read_problems(str(f), DataSpec(path=str(f)))
        assert len(p.question) == 200_000


class TestDataMessages:
    """#47: deeply nested JSON, columns of unequal length and malformed chat messages
    are one line naming the row and what is wrong with it."""

    @pytest.mark.parametrize("name", ["d.jsonl", "d.json"])
    def test_json_nested_too_deeply(self, tmp_path, name):
        f = tmp_path / name
        deep = "[" * 100_000 + "]" * 100_000
        f.write_text(deep + "\n" if name == "d.jsonl" else f'[{{"question": {deep}}}]')
        with pytest.raises(ConfigError, match="nested more than 64 levels deep"):
            read_problems(str(f), DataSpec(path=str(f)))

    @pytest.mark.parametrize(("answer", "kind"), [({"n": 1}, "object"), ([1, 2], "array")])
    def test_an_answer_that_is_no_text_nor_number(self, tmp_path, answer, kind):
        f = tmp_path / "d.jsonl"
        f.write_text(json.dumps({"question": "q?", "answer": answer}) + "\n")
        with pytest.raises(
            ConfigError,
            match=f"d.jsonl:1: the answer \\('answer'\\) is a JSON {kind}, not text or a number",
        ):
            read_problems(str(f), DataSpec(path=str(f)))

    def test_json_columns_of_unequal_length(self, tmp_path):
        f = tmp_path / "d.json"
        f.write_text('{"question": ["a", "b", "c"], "answer": [1, 2]}')
        with pytest.raises(ConfigError, match=r"unequal lengths \(question: 3, answer: 2\)"):
            read_problems(str(f), DataSpec(path=str(f)))

    @pytest.mark.parametrize(
        ("messages", "words"),
        [
            ([{"role": "user"}], "'messages'[0] has no 'content'"),
            ([{"role": "bot", "content": "hi"}], "'messages'[0] has role 'bot'"),
            ([{"role": "user", "content": 5}], "'messages'[0]'s content is a number, not text"),
            ([], "'messages' is an empty conversation"),
            ([1, 2], "'messages'[0] is a number, not a message"),
            (
                [{"role": "user", "content": "hi"}, {"role": "assistant"}],
                "'messages'[1] has no 'content'",
            ),
            ({"role": "user", "content": "x"}, "'messages' holds one message, not a list"),
        ],
    )
    def test_malformed_chat_messages(self, tmp_path, messages, words):
        good = [
            {
                "messages": [
                    {"role": "user", "content": f"{a}+1?"},
                    {"role": "assistant", "content": str(a + 1)},
                ]
            }
            for a in range(3)
        ]
        f = tmp_path / "d.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in [*good, {"messages": messages}]))
        with pytest.raises(ConfigError, match=re.escape(f"d.jsonl:4: {words}")):
            read_problems(str(f), DataSpec(path=str(f)))


def test_a_hub_dataset_without_the_datasets_package(monkeypatch):
    import importlib.util

    from rlctl.core.trainer.data.hub import hub_rows

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a)
    )
    with pytest.raises(ConfigError, match="needs the 'datasets' package") as e:
        hub_rows("openai/gsm8k", "main", "train")
    assert "pip install datasets" in (e.value.hint or "")
