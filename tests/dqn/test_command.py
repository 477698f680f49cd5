"""``gper train``: the command line, its error exit, and the line it prints for a missing package."""

from __future__ import annotations

import re
import sys

import pytest

from gper.cli import main


def test_train_command_line(tmp_path, capsys):
    argv = ["train", "--device", "cpu", "--total-steps", "300", "--learning-starts", "100", "--batch-size", "16"]
    argv += ["--buffer-size", "500", "--epoch-steps", "100", "--hidden", "8", "--progress", "False"]
    argv += ["--run-dir", str(tmp_path), "--run-name", "cli"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "gper train: done" in out and '"env_steps": 300' in out
    assert (tmp_path / "cli" / "plot.png").exists()


def test_train_command_line_reports_bad_settings(capsys):
    assert main(["train", "--device", "cpu", "--batch-size", "0", "--progress", "False"]) == 2
    assert "batch_size must be an integer >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--learning-rate", "inf"], "learning_rate must be a finite number > 0, got inf"),
        (["--max-grad-norm", "nan"], "max_grad_norm must be a finite number >= 0 (0: no clipping), got nan"),
        (["--gamma", "nan"], "gamma must be in [0, 1], got nan"),
    ],
)
def test_train_command_line_refuses_non_finite_settings_in_one_line(tmp_path, capsys, flags, message):
    argv = ["train", "--device", "cpu", "--progress", "False", "--run-dir", str(tmp_path), *flags]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == f"gper train: error: {message}\n" and captured.out == ""
    assert not any(tmp_path.iterdir())  # nothing ran


@pytest.mark.parametrize("package", ["tyro", "tqdm"])
def test_train_command_without_a_package_names_the_extra(package, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # import <package> raises ImportError
    assert main(["train", "--device", "cpu", "--run-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f'gper train needs {package}: pip install ".[train]"\n' and captured.out == ""
    assert not any(tmp_path.iterdir())  # nothing ran


def test_train_without_a_progress_bar_needs_no_tqdm(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    argv = ["train", "--device", "cpu", "--total-steps", "200", "--learning-starts", "100", "--batch-size", "16"]
    argv += ["--buffer-size", "500", "--epoch-steps", "100", "--hidden", "8", "--progress", "False"]
    argv += ["--run-dir", str(tmp_path), "--run-name", "plain"]
    assert main(argv) == 0
    assert "gper train: done" in capsys.readouterr().out


def test_train_command_without_gymnasium_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    argv = ["train", "--device", "cpu", "--env", "gym:CartPole-v1", "--progress", "False", "--run-dir", str(tmp_path)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == 'gper train: error: gym:CartPole-v1 needs Gymnasium: pip install ".[gym]"\n'
    assert "Traceback" not in captured.out + captured.err


def test_train_help_shows_the_values_that_run(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--env", "market", "--device", "cpu", "--help"])
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    for flag in ("--total-steps", "--num-envs", "--hidden", "--buffer-size", "--batch-size", "--learning-rate"):
        text = re.split(r" --(?!env market on)", out.split(f" {flag} ")[1])[0]  # its help, up to the next flag
        assert "(default: None)" not in text and "(default for --env market on the CPU: " in text, text
    assert "(default for --env market on the CPU: 131072)" in out
    assert "market 2000000 / 300000" in out  # every environment's presets, CUDA / CPU


def test_train_help_names_the_packaged_bars_and_the_data_extra(capsys):
    from gper.envs.packaged import PACKAGED, PREFIX

    with pytest.raises(SystemExit):
        main(["train", "--env", "market", "--device", "cpu", "--help"])
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    data = re.split(r" --(?!env )", out.split(" --data ")[1])[0]
    assert all(f"{PREFIX}{name}" in data for name in PACKAGED) and 'pip install ".[data]"' in data, data


def test_train_help_after_a_resume_shows_the_checkpoint_settings(tmp_path, capsys):
    argv = ["train", "--device", "cpu", "--total-steps", "300", "--learning-starts", "100", "--batch-size", "16"]
    argv += ["--buffer-size", "500", "--epoch-steps", "100", "--hidden", "8", "--progress", "False"]
    argv += ["--run-dir", str(tmp_path), "--run-name", "a", "--tensorboard", "False"]
    assert main(argv) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "--resume", str(tmp_path / "a"), "--help"])
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    batch = re.split(r" --(?!env )", out.split(" --batch-size ")[1])[0]
    assert "(default: 16)" in batch and "default for --env" not in batch


def test_train_help_for_a_gymnasium_id_names_its_threshold(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--env", "gym:CartPole-v1", "--device", "cpu", "--help"])
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "Gymnasium's reward_threshold for the id" in out.split(" --solve-return ")[1][:200]


def test_train_command_shows_a_real_import_error_with_its_traceback(monkeypatch):
    def broken(*args, **kwargs):
        raise ImportError("cannot import name 'x' from 'y'")

    monkeypatch.setattr("gper.commands.train.train", broken)
    with pytest.raises(ImportError, match="cannot import name"):
        main(["train", "--device", "cpu", "--progress", "False"])


def test_the_walk_forward_flags_are_flat_and_fill_config_walk():
    import torch
    import tyro

    from gper.dqn import WalkForward
    from gper.dqn.help import command_config, from_config, to_config

    cls = command_config("market", torch.device("cpu"))
    flags = ["--steps-per-bar", "30", "--fold-train-bars", "100", "--select-metric", "log_pnl", "--seed", "3"]
    cfg = to_config(tyro.cli(cls, args=flags, config=(tyro.conf.FlagConversionOff,)))
    assert cfg.walk == WalkForward(steps_per_bar=30, fold_train_bars=100, select_metric="log_pnl")
    assert cfg.seed == 3 and not hasattr(cfg, "steps_per_bar")
    assert to_config(from_config(cls, cfg)) == cfg
