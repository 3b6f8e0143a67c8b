"""Serving a bundle on an existing engine (triton.py: Triton Inference Server's Python backend)."""
