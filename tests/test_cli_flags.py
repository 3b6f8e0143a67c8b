"""Every flag of every command, given a bad value: a message and exit code 2 (or a plain success where
the value is acceptable after all), never "internal error", a traceback or a hang.

The values come from each option's type (a negative or huge count, a word where a number goes,
NaN, a missing file, a directory, an empty file, a name no input has ...), so a flag added later is
swept too. In-process through click's CliRunner, with grapec's own error handling in the way.
"""
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

from grapec.tools.cli import main
from helpers import init, model, tinfo

BAD_TEXT = ["", "=", ",", "x", "x=", "x=abc", "x:1xq", "batch=-1", "batch=0", "batch=1:0", "nope=3",
            "x=1x8x8", "batch=99999999999", "x=1e3", "=5", "sm_", "sm_abc", "x=nan"]
BAD_INT = ["-1", "0", "abc", "99999999999", "1.5"]
BAD_FLOAT = ["-1", "-0.5", "nan", "inf", "abc"]
GOOD_BASE_OPTIONS = {"--dim": "batch=2"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("flags")
    rng = np.random.default_rng(0)
    m = model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
              [tinfo("x", shape=["batch", 8])], [tinfo("y")], [init("w", rng.standard_normal((8, 4)).astype(np.float32))])
    onnx.save(m, str(d / "m.onnx"))
    r = CliRunner().invoke(main, ["compile", str(d / "m.onnx"), "--dim", "batch=2", "--no-gpu", "-q", "-o",
                                  str(d / "m.grape")])
    assert r.exit_code == 0, r.output
    decoder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "real",
                           "llama_genai_fp32.onnx")
    r = CliRunner().invoke(main, ["compile", decoder, "--generate", "3", "--dim", "batch=1,prompt=4,kv_cache_dim=16",
                                  "--no-gpu", "-q", "-o", str(d / "gen.grape")])
    assert r.exit_code == 0, r.output
    (d / "empty").write_bytes(b"")
    (d / "adir").mkdir()
    return d


def _base(name: str, d) -> list:
    """A call of command `name` that succeeds, or fails only for a reason of its own (no GPU here)."""
    return {"compile": ["compile", str(d / "m.onnx"), "-o", str(d / "out.grape"), "--no-gpu", "-q", "--force"],
            "run": ["run", str(d / "m.grape")],
            "inspect": ["inspect", str(d / "m.grape")],
            "check": ["check", str(d / "m.onnx"), "-q"],
            "bench": ["bench", str(d / "m.onnx")],
            "calibrate": ["calibrate", "-o", str(d / "profile.json")],
            "export-triton": ["export-triton", str(d / "m.grape"), str(d / "repo"), "--overwrite"],
            "generate": ["generate", str(d / "gen.grape"), "--prompt-ids", "1 2", "--backend", "cpu", "-q"]}[name]


def _bad_values(param, d) -> list:
    kind = type(param.type).__name__
    if kind == "Choice":
        return ["bogus", ""]
    if kind == "IntRange" or kind == "IntParamType":
        return BAD_INT
    if kind == "FloatParamType":
        return BAD_FLOAT
    if kind == "Path":
        return [str(d / "missing" / "f"), str(d / "adir"), str(d / "empty"), ""]
    return BAD_TEXT


def _cases():
    out = []
    for name, cmd in main.commands.items():
        for p in cmd.params:
            if p.param_type_name != "option" or getattr(p, "is_flag", False):
                continue
            out.append((name, p.opts[-1] if p.opts[-1].startswith("--") else p.opts[0], p.name))
    return out


@pytest.mark.parametrize("command,flag,param", _cases(), ids=lambda v: str(v))
def test_a_bad_value_of_any_flag_is_a_user_error(files, command, flag, param):
    cmd = main.commands[command]
    p = next(q for q in cmd.params if q.name == param)
    runner = CliRunner()
    for value in _bad_values(p, files):
        args = _base(command, files) + [flag, value]
        if command in ("compile", "check", "bench") and flag != "--dim":
            args += ["--dim", GOOD_BASE_OPTIONS["--dim"]]
        r = runner.invoke(main, args, catch_exceptions=True)
        text = r.output   # stdout and stderr as the terminal shows them
        assert r.exception is None or isinstance(r.exception, SystemExit), \
            f"{' '.join(args)}: raised {type(r.exception).__name__}: {r.exception}"
        assert "internal error" not in text and "Traceback" not in text, f"{' '.join(args)}:\n{text}"
        assert r.exit_code in (0, 2), f"{' '.join(args)}: exit {r.exit_code}\n{text}"
        if r.exit_code == 2:
            assert text.strip(), f"{' '.join(args)}: exit 2 with no message"


def test_every_command_is_swept():
    assert {c for c, _, _ in _cases()} >= set(main.commands) - {"inspect"}   # inspect has flags only
