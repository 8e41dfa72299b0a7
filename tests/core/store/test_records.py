"""#47 point 2, rlctl never writes what it cannot read: spec.yaml, status.json and a
checkpoint's manifest each have one reader, and their writers pass what they are
about to write through it."""

from __future__ import annotations

import math

import pytest

from rlctl.core.config.models import RunSpec
from rlctl.core.errors import ConfigError, RlctlError
from rlctl.core.store import records


class TestSpec:
    def test_a_spec_reads_back_as_itself(self):
        spec = RunSpec(name="r", rewards=["correct", {"fn": "format", "weight": 0.5}])
        assert records.read_spec(records.spec_text(spec, "spec.yaml"), "spec.yaml") == spec

    def test_a_spec_its_reader_refuses_is_never_written(self):
        # model_copy skips validation: what resume --steps did before #47
        bad = RunSpec().model_copy(
            update={"training": RunSpec().training.model_copy(update={"steps": 10**20})}
        )
        with pytest.raises(RlctlError, match="cannot read back .*training.steps") as e:
            records.spec_text(bad, "runs/r/spec.yaml")
        assert not isinstance(e.value, ConfigError)  # a bug of rlctl's, not bad input

    @pytest.mark.parametrize(
        ("text", "words"),
        [
            ("training: {steps: 3\n", "not valid YAML"),
            ("- a\n", "not a mapping"),
            ("training:\n  steps: 100000000000000000000\n", "training.steps"),
            ("[" * 10_000 + "]" * 10_000, "nested too deeply"),
        ],
    )
    def test_the_reader_names_what_is_wrong(self, text, words):
        with pytest.raises(ConfigError, match=words):
            records.read_spec(text, "spec.yaml")


class TestStatus:
    def test_a_good_status_round_trips(self):
        data = {"name": "r", "phase": "running", "step": 3, "latest_checkpoint": None}
        assert records.read_status_text(records.status_text(data)) == (data, None)

    @pytest.mark.parametrize(
        ("data", "words"),
        [
            ({"phase": "runing"}, "phase 'runing' is not a phase"),
            ({"step": -1}, "step -1 is not a whole number"),
            ({"step": "3"}, "step '3' is not a whole number"),
            ({"step": True}, "step True"),
            ({"reward": math.nan}, "reward is nan"),
        ],
    )
    def test_what_its_reader_refuses_is_never_written(self, data, words):
        with pytest.raises(RlctlError, match=words):
            records.status_text({"name": "r", **data})

    def test_a_damaged_field_is_left_out_and_named_the_rest_kept(self):
        data, why = records.read_status_text(
            '{"name": "r", "phase": "running", "step": "x", "cluster": "c"}'
        )
        assert data == {"name": "r", "phase": "running", "cluster": "c"}
        assert why == "status.json: step 'x' is not a whole number >= 0"

    @pytest.mark.parametrize(
        ("text", "words"),
        [
            ('{"step": NaN}', "not valid JSON (NaN is not a JSON number)"),
            ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
            ("[1]", "a JSON list"),
            ("{", "not valid JSON (line 1)"),
        ],
    )
    def test_text_that_is_no_status(self, text, words):
        data, why = records.read_status_text(text)
        assert data == {} and words in why


class TestManifest:
    def test_a_manifest_round_trips(self):
        files = {"default/_METADATA": (12, "a" * 64), "_CHECKPOINT_METADATA": (0, "b" * 64)}
        assert records.read_manifest(records.manifest_text(files)) == files

    @pytest.mark.parametrize(
        "files",
        [{"../x": (1, "a" * 64)}, {"x": (-1, "a" * 64)}, {"x": (1, "short")}, {"": (1, "a" * 64)}],
    )
    def test_what_its_reader_refuses_is_never_written(self, files):
        with pytest.raises(RlctlError, match="manifest it cannot read back"):
            records.manifest_text(files)

    @pytest.mark.parametrize(
        "text",
        [
            '{"files": 3}',
            '{"nofiles": {}}',
            "[]",
            '{"files": {"x": [1]}}',
            '{"files": {"x": [NaN, "a"]}}',
        ],
    )
    def test_text_that_is_no_manifest(self, text):
        with pytest.raises(ValueError):
            records.read_manifest(text)
