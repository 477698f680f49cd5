"""``gper train`` with walk-forward windows: the run folder, the report, the summary, and the
settings it refuses (each in one line, before anything is written)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from gper.cli import main
from gper.dqn import Config, WalkForward, train
from gper.dqn.config import from_settings

SMALL = [
    "--env", "market", "--device", "cpu", "--backend", "torch", "--bars", "700",
    "--fold-train-bars", "200", "--fold-val-bars", "60", "--fold-test-bars", "80", "--fold-step-bars", "100",
    "--hidden", "16", "--num-envs", "8", "--batch-size", "32", "--buffer-size", "4096",
    "--learning-starts", "256", "--steps-per-bar", "6", "--validations", "3", "--episode-len", "64",
    "--progress", "False", "--tensorboard", "False",
]  # fmt: skip


CFG = dict(
    env="market", device="cpu", backend="torch", bars=700, hidden=(16,), num_envs=8, batch_size=32, buffer_size=4096,
    learning_starts=256, steps_per_bar=6, validations=3, episode_len=64, progress=False, tensorboard=False,
)  # fmt: skip


def test_walk_forward_from_the_command_line(tmp_path, capsys):
    torch.set_num_threads(1)
    assert main(["train", *SMALL, "--run-dir", str(tmp_path), "--run-name", "wf"]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "wf"
    config = json.loads((folder / "config.json").read_text())
    n = len(config["folds"])
    assert n == 4 and config["windows"] == {"unit": "bars", "train": 200, "val": 60, "test": 80, "step": 100}
    assert all(f["total_steps"] == 6 * 200 for f in config["folds"])
    for k in range(n):
        record = json.loads((folder / "folds" / f"fold_{k:03d}.json").read_text())
        assert len(record["validations"]) == 3 and "policy" in record["test"]
        assert (folder / "folds" / f"fold_{k:03d}.pt").exists()
    report = json.loads((folder / "report.json").read_text())
    oos = report["out_of_sample"]
    assert oos["bars"] == 4 * 80 and len(report["folds"]) == n
    assert oos["flat"]["log_pnl"] == 0.0
    assert abs(oos["policy"]["log_pnl"] - sum(f["policy"]["log_pnl"] for f in report["folds"])) < 1e-9
    # the console numbers the folds as their files and the report do
    assert [int(k) for k in re.findall(r"gper train: fold (\d+) \(of 0\.\.3\)", out)] == list(range(n))
    assert [f["index"] for f in report["folds"]] == list(range(n))
    assert "out of sample" in out and '"out_of_sample"' in out
    md = (folder / "report.md").read_text()
    assert "against flat" in md and "buy-and-hold" in md
    assert (folder / "equity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--env", "cartpole", "--train-months", "3", "--val-months", "1", "--test-months", "1"], "market environment"),
        (["--env", "market", "--train-months", "3", "--val-days", "1", "--test-months", "1"], "one unit only"),
        (["--env", "market", "--train-months", "3", "--test-months", "1"], "val missing"),
        (
            ["--env", "market", "--train-months", "3", "--val-months", "1", "--test-months", "2", "--step-months", "1"],
            "overlap",
        ),
        (
            ["--env", "market", "--bars", "300", "--train-months", "36", "--val-months", "1", "--test-months", "1"],
            "no complete fold",
        ),
        (SMALL + ["--steps-per-bar", "1"], "learning_starts"),
        (SMALL + ["--total-steps", "100"], "raise total_steps"),
        (SMALL + ["--sampling", "rank"], "re-sort ranks"),
    ],
)
def test_bad_walk_forward_settings_are_refused_in_one_line(flags, message, tmp_path, capsys):
    assert main(["train", *flags, "--device", "cpu", "--run-dir", str(tmp_path), "--progress", "False"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_the_plain_trainer_refuses_walk_forward_windows():
    with pytest.raises(ValueError, match="gper.walkforward"):
        windows = WalkForward(fold_train_bars=100, fold_val_bars=10, fold_test_bars=10)
        train(Config(env="market", walk=windows, device="cpu"))


@pytest.mark.parametrize(
    "field, value",
    [
        ("steps_per_bar", 10),
        ("validations", 3),
        ("select_metric", "log_pnl"),
        ("flat_fallback", False),
        ("min_deflated_sharpe", 0.95),
    ],
)
def test_walk_forward_settings_without_windows_are_refused(field, value):
    with pytest.raises(ValueError, match=f"{field} is a walk-forward setting"):
        train(Config(env="market", device="cpu", walk=WalkForward(**{field: value})))


def test_annual_sharpe_counts_the_gaps_between_test_windows_as_time(tmp_path):
    """With a step longer than the test window, bars per year come from every bar of the
    out-of-sample span, not from the test bars alone (which would halve it here)."""
    from gper.walkforward.run import walk_forward

    flags = dict(fold_train_bars=200, fold_val_bars=60, fold_test_bars=60, fold_step_bars=120)
    cfg = from_settings(CFG | flags | dict(run_dir=str(tmp_path), run_name="gaps"))
    report = walk_forward(cfg, log=lambda line: None).report
    per_year = report["out_of_sample"]["bars_per_year"]
    assert 255 < per_year < 265  # weekday bars: 365.25 * 5 / 7 = 260.9


def test_help_with_windows_shows_the_walk_forward_preset(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--env", "market", "--device", "cpu", "--train-months", "36", "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "walk-forward: 256 256" in out and "walk-forward: 64" in out


def test_a_stopped_walk_forward_run_resumes_where_it_stopped_and_ends_as_the_whole_run(tmp_path, monkeypatch, capsys):
    """Ctrl-C inside fold 3 of 4, then ``--resume``: the finished folds are read back, the rest
    run, and the report is the uninterrupted run's, number for number (on the CPU runs are
    deterministic)."""
    import gper.walkforward.run as run_module

    torch.set_num_threads(1)
    assert main(["train", *SMALL, "--run-dir", str(tmp_path), "--run-name", "whole"]) == 0
    real = run_module.run_fold
    calls = []

    def stop_in_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "run_fold", stop_in_the_third)
    assert main(["train", *SMALL, "--run-dir", str(tmp_path), "--run-name", "cut"]) == 130
    assert "stopped after 2 of 4 folds; continue with --resume" in capsys.readouterr().out
    assert not (tmp_path / "cut" / "report.json").exists()
    monkeypatch.setattr(run_module, "run_fold", real)
    assert main(["train", "--resume", str(tmp_path / "cut"), "--progress", "False"]) == 0
    out = capsys.readouterr().out
    assert out.count("(done before)") == 2
    whole, cut = (json.loads((tmp_path / n / "report.json").read_text()) for n in ("whole", "cut"))
    assert whole["folds"] == cut["folds"]
    assert whole["out_of_sample"] == cut["out_of_sample"]


def test_a_resume_that_changes_what_a_fold_computes_is_refused(tmp_path, capsys):
    torch.set_num_threads(1)
    assert main(["train", *SMALL, "--run-dir", str(tmp_path), "--run-name", "a"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "a"), "--learning-rate", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "learning_rate was None, now 0.01" in err and "Traceback" not in err  # None: the preset's


def test_a_walk_forward_run_whose_config_json_holds_the_walk_settings_flat_resumes(tmp_path, monkeypatch, capsys):
    """A run folder written before ``Config.walk`` (its ``config.json`` with ``steps_per_bar``,
    ``fold_train_bars``, ... among the other settings) resumes as one written since."""
    import gper.walkforward.run as run_module

    torch.set_num_threads(1)
    real = run_module.run_fold
    calls = []

    def stop_in_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "run_fold", stop_in_the_third)
    assert main(["train", *SMALL, "--run-dir", str(tmp_path), "--run-name", "old"]) == 130
    monkeypatch.setattr(run_module, "run_fold", real)
    stored = tmp_path / "old" / "config.json"
    meta = json.loads(stored.read_text())
    walk = meta["config"].pop("walk")
    meta["config"] |= walk
    stored.write_text(json.dumps(meta))
    resumed = run_module.resume_config(tmp_path / "old")
    assert resumed.walk.steps_per_bar == 6 and resumed.walk.fold_train_bars == 200 and resumed.walk.validations == 3
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "old"), "--progress", "False"]) == 0
    assert capsys.readouterr().out.count("(done before)") == 2
    assert len(json.loads((tmp_path / "old" / "report.json").read_text())["folds"]) == 4
