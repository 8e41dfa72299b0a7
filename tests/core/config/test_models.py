import pytest

from rlctl.core.config.load import build, parse_override
from rlctl.core.config.models import RunSpec
from rlctl.core.errors import ConfigError
from rlctl.core.names import generate_run_name, validate_name
from rlctl.core.runs.spec import resolve_run_spec


class TestRunSpecDefaults:
    def test_grpo(self):
        t = RunSpec(algorithm="grpo").training
        assert (t.epsilon, t.epsilon_high, t.num_iterations) == (0.2, 0.2, 1)

    def test_gspo_differs_from_grpo_by_default(self):
        t = RunSpec(algorithm="gspo").training
        assert t.num_iterations == 2
        assert (t.epsilon, t.epsilon_high) == (3e-4, 4e-4)

    def test_kl_estimator_defaults_to_k3(self):
        assert RunSpec().training.kl_estimator == "k3"

    def test_explicit_values_win(self):
        t = build(RunSpec, {"algorithm": "gspo"}, ["training.num_iterations=1"]).training
        assert t.num_iterations == 1


class TestValidationErrors:
    def test_unknown_key_names_the_path(self):
        with pytest.raises(ConfigError, match=r"training\.stpes: unknown field"):
            build(RunSpec, {}, ["training.stpes=3"])

    def test_out_of_range_names_the_path(self):
        with pytest.raises(ConfigError, match=r"rollout\.num_generations: .*greater than or eq"):
            build(RunSpec, {}, ["rollout.num_generations=1"])

    def test_wrong_type(self):
        with pytest.raises(ConfigError, match=r"training\.learning_rate"):
            build(RunSpec, {}, ["training.learning_rate=fast"])

    def test_epsilon_high_below_epsilon(self):
        with pytest.raises(ConfigError, match="epsilon_high must be >= training.epsilon"):
            build(RunSpec, {}, ["training.epsilon=0.3", "training.epsilon_high=0.1"])

    def test_bad_override_syntax(self):
        with pytest.raises(ConfigError, match="key.path=value"):
            parse_override("training.steps")

    def test_yaml_file(self, tmp_path):
        f = tmp_path / "run.yaml"
        f.write_text("training:\n  steps: 7\nrollout:\n  temperature: 0.7\n")
        spec = resolve_run_spec("grpo", str(f), ["training.steps=9"])
        assert (spec.training.steps, spec.rollout.temperature) == (9, 0.7)

    def test_yaml_file_errors(self, tmp_path):
        f = tmp_path / "bad.yaml"
        f.write_text("training: [unclosed\n")
        with pytest.raises(ConfigError, match="not valid YAML at line"):
            resolve_run_spec("grpo", str(f))
        with pytest.raises(ConfigError, match="does not exist"):
            resolve_run_spec("grpo", str(tmp_path / "missing.yaml"))

    def test_env_overrides(self, monkeypatch):
        monkeypatch.setenv("RLCTL_SET", "training.steps=4; eval.size=8")
        spec = build(RunSpec, {})
        assert (spec.training.steps, spec.eval.size) == (4, 8)


class TestResolveRunSpec:
    def test_flags_beat_set_and_file(self, tmp_path):
        f = tmp_path / "run.yaml"
        f.write_text("training:\n  steps: 7\n")
        spec = resolve_run_spec("grpo", str(f), ["training.steps=8"], {"training.steps": 9})
        assert spec.training.steps == 9

    def test_algorithm_mismatch(self, tmp_path):
        f = tmp_path / "run.yaml"
        f.write_text("algorithm: gspo\n")
        with pytest.raises(ConfigError, match="says algorithm 'gspo'"):
            resolve_run_spec("grpo", str(f))

    def test_string_flag_stays_a_string(self):
        spec = resolve_run_spec("grpo", flags={"model.source": "1e5"})
        assert spec.model.source == "1e5"


class TestNames:
    @pytest.mark.parametrize("name", ["a", "run-1", "grpo-20261122-101500-3fa2", "x" * 40])
    def test_valid(self, name):
        assert validate_name(name) == name

    @pytest.mark.parametrize(
        "name", ["", "1run", "Run", "run_1", "run-", "-run", "r.un", "x" * 41, "ru n", "run\n"]
    )
    def test_invalid(self, name):
        with pytest.raises(ConfigError):
            validate_name(name)

    def test_generated_names_are_valid(self):
        assert validate_name(generate_run_name("gspo", now=0)).startswith("gspo-19700101-")


class TestUnreadableInputs:
    """Each gives one ConfigError (exit 2) that says what is wrong, never a traceback."""

    def test_a_directory_is_not_a_missing_file(self, tmp_path):
        with pytest.raises(ConfigError, match="is a directory, not a file"):
            resolve_run_spec("grpo", str(tmp_path))

    def test_binary_and_non_utf8_configs(self, tmp_path):
        for name, data in [
            ("bin.yaml", bytes(range(256))),
            ("latin1.yaml", "a: caf\xe9".encode("latin-1")),
        ]:
            (tmp_path / name).write_bytes(data)
            with pytest.raises(ConfigError, match="is not UTF-8 text"):
                resolve_run_spec("grpo", str(tmp_path / name))

    def test_a_file_that_cannot_be_read(self):
        with pytest.raises(ConfigError, match="cannot be read"):
            resolve_run_spec("grpo", "/proc/self/mem")

    @pytest.mark.parametrize("value", [float("nan"), float("inf")])
    def test_non_finite_numbers_are_named_as_such(self, value):
        with pytest.raises(ConfigError, match="learning_rate: Input should be a finite number"):
            resolve_run_spec("grpo", flags={"training.learning_rate": value})
        with pytest.raises(ConfigError, match="should be a finite number"):
            resolve_run_spec("grpo", overrides=[f"training.beta={value}"])

    def test_an_empty_run_store_root_is_refused_not_read_as_dot_runs(self):
        with pytest.raises(ConfigError, match="output.root"):
            resolve_run_spec("grpo", flags={"output.root": ""})
