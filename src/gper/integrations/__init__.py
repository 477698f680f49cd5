"""Adapters that put gper's buffer under other RL libraries.

Each adapter is a subpackage that imports its library when it is imported itself (never here),
and raises ImportError naming the pip extra when that library is missing:

* :mod:`gper.integrations.sb3`: Stable-Baselines3 (``pip install "gper[sb3]"``).
"""
