"""The SB3 adapter's imports: ``gper.integrations`` never imports Stable-Baselines3, and without it
``gper.integrations.sb3`` raises one line that names the pip extra (run in subprocesses, so the
modules this process has imported do not count)."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_integrations_package_imports_no_rl_library():
    out = _run("import sys, gper.integrations\nprint('stable_baselines3' in sys.modules, 'gymnasium' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_without_sb3_the_adapter_names_the_extra():
    # a None entry in sys.modules makes `import stable_baselines3` raise ImportError, as if absent
    code = (
        "import sys\n"
        "sys.modules['stable_baselines3'] = None\n"
        "try:\n"
        "    import gper.integrations.sb3\n"
        "except ImportError as err:\n"
        "    print(repr(str(err)))\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == repr('gper.integrations.sb3 needs stable-baselines3: pip install ".[sb3]"')
