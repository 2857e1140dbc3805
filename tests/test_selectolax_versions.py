"""The walk's calibration against every selectolax release the dependency pin allows.

Each release is installed (without dependencies) into a cache directory, and a subprocess that
imports it in place of the installed one checks that the compiled walk binds and gives the
Python walk's text. A release outside the pin (0.3.21, before the lexbor options extract.py
uses) still goes through the calibration itself, which must bind or refuse, never crash.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "stream-dedup"
# Every release the pin in pyproject.toml allows (test_the_list_is_the_pin keeps them equal).
PINNED = ("1.0.1", "1.0.2")
BEFORE_PIN = "0.3.21"


def _pin() -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return next(Requirement(d) for d in project["dependencies"] if d.startswith("selectolax"))


def test_the_list_is_the_pin() -> None:
    spec = _pin().specifier
    assert all(v in spec for v in PINNED)
    assert BEFORE_PIN not in spec
    assert "1.1.0" not in spec  # an untested minor release must be added here first


def _installed(version: str) -> Path:
    target = CACHE / f"selectolax-{version}"
    if not (target / "selectolax").is_dir():
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
             "--disable-pip-version-check", "--target", str(target), f"selectolax=={version}"],
            capture_output=True, text=True, timeout=600,
            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},  # not pip under ASan
        )  # fmt: skip
        if done.returncode != 0:
            pytest.fail(f"could not install selectolax {version}:\n{done.stderr[-2000:]}")
    return target


def _run(version: str, script: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_installed(version)), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


_SAME_TEXT = """
import selectolax
from stream_dedup.core import extract
assert selectolax.__version__ == {version!r}, selectolax.__version__
assert extract.NATIVE_WALK, "the walk did not bind"
pages = [
    "<p>one<b>two</b></p><div>three</div><script>no</script><rt>no</rt>",
    "<table><tr><td>a<td>b</table><noscript><p>x</p></noscript>" * 50,
    "\\u4e2d\\u6587<br>\\U0001f600<p>caf\\u00e9</p><svg><text>no</text></svg>",
    "<frameset><noframes><p>frames</p></noframes></frameset>",
]
for html in pages:
    extract.NATIVE_WALK = True
    native = extract.visible_text(html)
    extract.NATIVE_WALK = False
    assert native == extract.visible_text(html), html
print("ok")
"""

_CALIBRATE_ONLY = """
import glob, importlib.util
import selectolax, selectolax.lexbor as lexbor
so = glob.glob({core!r} + "/_native*.so")[0]
spec = importlib.util.spec_from_file_location("_native", so)
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)
marker = "stream-dedup calibration text 0123456789"
text = lexbor.LexborHTMLParser("<p>" + marker + "</p>").css_first("p").first_child
try:
    native.bind_lexbor(lexbor.__file__, text, marker.encode(), b"recalibrated")
    print("bound")
except ImportError as refused:
    print("refused", refused)
"""


@pytest.mark.parametrize("version", PINNED)
def test_walk_binds_and_matches_the_python_walk(version: str) -> None:
    assert _run(version, _SAME_TEXT.format(version=version)).strip() == "ok"


def test_calibration_outside_the_pin_binds_or_refuses() -> None:
    core = str(REPO / "stream_dedup" / "core")
    if not list(Path(core).glob("_native*.so")):
        pytest.skip("the C extension is not built")
    out = _run(BEFORE_PIN, _CALIBRATE_ONLY.format(core=core))
    assert out.startswith(("bound", "refused")), out
