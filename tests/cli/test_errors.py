"""Every error is one line on stderr with the documented exit code: no traceback, no
markup eaten, no library log lines."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from rlctl.cli._errors import guarded, unexpected_message
from rlctl.cli._logging import configure_library_logging
from rlctl.cli._options import AppState
from rlctl.cli._output import Output, make_table


def _rlctl(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlctl", *args], capture_output=True, text=True, cwd=cwd
    )


def _boom_app(exc: BaseException) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @guarded
    def boom(ctx: typer.Context) -> None:
        raise exc

    return app


class TestUnexpected:
    def test_one_line_exit_1_and_how_to_see_more(self):
        r = CliRunner().invoke(
            _boom_app(RuntimeError("disk on fire\nsecond line")), [], obj=AppState()
        )
        assert r.exit_code == 1
        assert r.stderr.splitlines() == [
            "error: unexpected error: RuntimeError: disk on fire",
            "hint: run again with --debug for the traceback, and report it",
        ]
        assert r.stdout == ""

    def test_debug_re_raises(self):
        r = CliRunner().invoke(_boom_app(RuntimeError("x")), [], obj=AppState(debug=True))
        assert isinstance(r.exception, RuntimeError)

    def test_typer_exits_pass_through(self):
        r = CliRunner().invoke(_boom_app(typer.Exit(3)), [], obj=AppState())
        assert r.exit_code == 3 and r.stderr == ""

    def test_long_messages_are_cut(self):
        msg = unexpected_message(ValueError("x" * 1000))
        assert msg.startswith("ValueError: xxx") and len(msg) <= 300

    def test_damaged_store_file_is_reported_not_a_traceback(self, tmp_path):
        run = tmp_path / "r1"
        run.mkdir()
        (run / "spec.yaml").write_text("name: r1\n")
        (run / "status.json").write_text("[1, 2]")  # valid JSON, wrong shape
        out = _rlctl("status", "r1", "--runs-dir", str(tmp_path))
        # the store reads damaged files without falling over: the run is shown as such
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr + out.stdout
        assert "damaged: status.json holds a JSON list" in out.stdout


class TestNoMarkup:
    """Messages are data: brackets print as written and never raise MarkupError."""

    def test_hint_keeps_the_extra_in_brackets(self, capsys):
        Output().error("this command needs the 'gcp' extra", "pip install 'rlctl[gcp]'")
        assert "hint: pip install 'rlctl[gcp]'" in capsys.readouterr().err

    def test_closing_tag_in_a_message_prints(self, capsys):
        Output().error("bad path /data/[/x]/[bold]y")
        Output().info("[red]not red[/red]")
        err = capsys.readouterr().err
        assert "bad path /data/[/x]/[bold]y" in err and "[red]not red[/red]" in err

    def test_table_cells_are_text(self, capsys):
        Output().result(None, make_table("t [/x]", ["A"], [["[b]cell[/b]"], ["[/oops]"]]))
        out = capsys.readouterr().out
        assert "[b]cell[/b]" in out and "[/oops]" in out and "t [/x]" in out

    def test_runs_dir_with_brackets(self, tmp_path):
        root = tmp_path / "a[/x]b"
        out = _rlctl("status", "nope", "--runs-dir", str(root))
        assert out.returncode == 3, out.stderr
        assert f"{root}" in out.stderr and "Traceback" not in out.stderr

    def test_missing_extra_hint(self, tmp_path, monkeypatch):
        """The hint names the extra with its brackets (it used to print 'rlctl'), in
        the pip command that fits this install."""
        from rlctl.core.errors import MissingDependencyError, require_extra
        from rlctl.core.install import extra_install_command

        with pytest.raises(MissingDependencyError) as e:
            require_extra("no_such_module_for_rlctl", "gcp")
        app = _boom_app(e.value)
        r = CliRunner().invoke(app, [], obj=AppState())
        hint = extra_install_command("gcp", constrained=True)  # with -c constraints.txt
        assert r.exit_code == 8 and f"hint: {hint}\n" in r.stderr
        assert "[gcp]" in r.stderr


class TestProgressOutsideATerminal:
    def test_one_plain_line_per_step(self, capsys):
        from rlctl.cli.progress import TrainProgress

        out = Output()
        assert not out.interactive  # pytest captures stderr: not a terminal
        with TrainProgress(out) as p:
            p.callback({"event": "start", "name": "r", "step": 0, "total_steps": 3})
            for k in (1, 2, 3):
                p.callback(
                    {
                        "event": "step",
                        "step": k,
                        "metrics": {
                            "reward_mean": 0.5,
                            "accuracy": 0.25,
                            "loss": 0.0,
                            "step_seconds": 2.0,
                        },
                    }
                )
        lines = capsys.readouterr().err.splitlines()
        steps = [x for x in lines if x.startswith("step ")]
        assert steps == [
            "step 1/3  reward 0.500  accuracy 0.250  loss +0.0000  2.0 s/step",  # compiled
            "step 2/3  reward 0.500  accuracy 0.250  loss +0.0000  2.0 s/step  eta 2s",
            "step 3/3  reward 0.500  accuracy 0.250  loss +0.0000  2.0 s/step  eta 0s",
        ]

    def test_apply_progress_is_lines(self, capsys):
        with Output().progress() as p:
            t = p.add_task("create cluster/rl", total=1, info="queued")
            p.update(t, info="running")
            p.update(t, completed=1, info="done")
        err = capsys.readouterr().err.splitlines()
        assert err == ["create cluster/rl: 0/1  running", "create cluster/rl: 1/1  done"]


class TestLibraryLogging:
    def test_quiet_by_default_and_back_with_v(self, caplog):
        logger = logging.getLogger("absl")
        configure_library_logging(0)
        assert not logger.isEnabledFor(logging.ERROR)  # CRITICAL only: fatal, and rare
        configure_library_logging(1)
        assert logger.isEnabledFor(logging.WARNING) and not logger.isEnabledFor(logging.INFO)
        configure_library_logging(2)
        assert logger.isEnabledFor(logging.INFO)
        configure_library_logging(0)

    def test_orbax_style_warning_does_not_reach_stderr(self, tmp_path):
        """absl's logger (what Orbax logs through) prints nothing under rlctl by default."""
        code = (
            "import sys, json; from rlctl.cli.app import app; "
            "from rlctl.cli._logging import configure_library_logging; "
            "configure_library_logging(0); "
            "from absl import logging as absl_logging; "
            "absl_logging.error('orbax-style background error'); "
            "absl_logging.warning('orbax-style warning')"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0 and out.stderr == "", out.stderr


def test_json_errors_are_one_json_object_on_stdout(tmp_path):
    out = _rlctl("status", "nope", "--runs-dir", str(tmp_path), "-o", "json")
    assert out.returncode == 3
    assert json.loads(out.stdout) == {
        "error": f"run 'nope' not found in {tmp_path}",
        "hint": "list the runs there with 'rlctl status "
        f"--runs-dir {tmp_path}', or pass the "
        "--runs-dir that holds it",
        "exit_code": 3,
    }


class TestTheLiveClock:
    def test_the_elapsed_clock_runs_on_after_the_last_step(self):
        """#53: rich stops a task's clock when its bar is full, so the run's elapsed time
        froze through the final eval; the spinner stopped with it."""
        from rlctl.cli._output import Output

        now = [100.0]
        bar = Output().train_bar()
        bar.get_time = lambda: now[0]
        task_id = bar.add_task("r", total=2, count="", info="", eta="")
        bar.update(task_id, completed=2)  # the last step: the final eval follows
        task = bar.tasks[0]
        assert task.finished
        elapsed = bar.columns[5]
        spinner = bar.columns[0]
        now[0] += 75  # the final eval
        assert str(elapsed.render(task)) == "0:01:15"
        first = str(spinner.render(task))
        now[0] += 0.5
        assert str(spinner.render(task)) != first  # still spinning
