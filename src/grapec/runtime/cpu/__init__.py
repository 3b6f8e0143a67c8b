"""The CPU backend: the plan interpreted with numpy over one arena (runner.py)."""
