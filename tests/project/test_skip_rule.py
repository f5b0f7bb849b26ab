"""The skip rule of tests/conftest.py: under CI=true a skip fails, except a missing
GPU (a test marked gpu) and an importorskip of a module in OPTIONAL_MODULES.

Each case runs a small test file under a copy of the real conftest in a pytest
subprocess, once with CI=true and once without, and reads the outcomes from its
JUnit XML report.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

from conftest import GPU_SKIP_REASON, HERE, ci_build_problems, skip_verdict

# The case files import modules that do not exist, on purpose: they are the
# skips the rule must refuse or allow, not dependencies of the test suite.
CASES = textwrap.dedent('''
    import pytest

    MISSING = "tokenfeed_no_such_module"
    STAND_IN = "tokenfeed_optional_for_test"   # OPTIONAL_MODULES gets it in run_cases

    def test_passes():
        pass

    def test_missing_module():
        pytest.importorskip(MISSING)

    def test_missing_submodule():
        pytest.importorskip(MISSING + ".sub")

    def test_optional_module():
        pytest.importorskip(STAND_IN)

    def test_plain_skip():
        pytest.skip("the machine lacks something")

    @pytest.mark.skipif(True, reason="a condition")
    def test_skipif():
        pass

    @pytest.mark.gpu
    def test_gpu():
        pass

    @pytest.mark.gpu
    @pytest.mark.skipif(True, reason="not a GPU reason")
    def test_gpu_marked_other_skip():
        pass

    @pytest.mark.xfail(reason="known", strict=True)
    def test_xfail():
        assert False
''')
MODULE_SKIP = 'import pytest\nMISSING = "tokenfeed_no_such_module"\npytest.importorskip(MISSING)\n\ndef test_never_runs():\n    pass\n'


def run_cases(tmp_path, ci: bool, files: dict) -> tuple[int, dict, str]:
    d = tmp_path / ("ci" if ci else "local")
    d.mkdir()
    with open(os.path.join(HERE, "conftest.py")) as f:
        conftest = f.read()
    # a stand-in optional dependency; and the case files test the rule, not the build, so a build
    # without hooks or zstd (a local run) must not stop them
    conftest += ('\nOPTIONAL_MODULES["tokenfeed_optional_for_test"] = "a stand-in for an optional dependency"\n'
                 "ci_build_problems = lambda info: []\n")
    (d / "conftest.py").write_text(conftest)
    for name, text in files.items():
        (d / name).write_text(text)
    env = dict(os.environ)
    env.pop("CI", None)
    if ci:
        env["CI"] = "true"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(d),
                        "--junitxml", str(d / "report.xml"), str(d)], cwd=d, env=env, capture_output=True, text=True,
                       timeout=300)
    outcomes = {}
    if (d / "report.xml").exists():
        for case in ET.parse(d / "report.xml").iter("testcase"):
            kinds = [c.tag for c in case]
            outcomes[case.get("name") or case.get("classname")] = \
                "failed" if "failure" in kinds or "error" in kinds else "skipped" if "skipped" in kinds else "passed"
    return p.returncode, outcomes, p.stdout + p.stderr


def has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def test_under_ci_only_gpu_and_optional_skips_pass(tmp_path):
    rc, out, log = run_cases(tmp_path, True, {"test_cases.py": CASES})
    assert rc == 1, log
    gpu = "passed" if has_gpu() else "skipped"
    assert out == {
        "test_passes": "passed",
        "test_missing_module": "failed",
        "test_missing_submodule": "failed",
        "test_optional_module": "skipped",
        "test_plain_skip": "failed",
        "test_skipif": "failed",
        "test_gpu": gpu,
        "test_gpu_marked_other_skip": "failed",
        "test_xfail": "skipped",  # xfail is reported as skipped in JUnit XML; it is not a skip
    }, log
    assert "pyproject.toml" in log and "tokenfeed_no_such_module" in log  # says what to fix


def test_outside_ci_skips_stay_skips(tmp_path):
    rc, out, log = run_cases(tmp_path, False, {"test_cases.py": CASES})
    assert rc == 0, log
    assert out["test_missing_module"] == out["test_plain_skip"] == out["test_skipif"] == "skipped", log
    assert out["test_passes"] == "passed"


def test_under_ci_a_module_skipped_whole_fails(tmp_path):
    files = {"test_whole.py": MODULE_SKIP, "test_other.py": "def test_other():\n    pass\n"}
    rc, _, log = run_cases(tmp_path, True, files)
    assert rc != 0 and "tokenfeed_no_such_module" in log and "pyproject.toml" in log, log
    rc, _, log = run_cases(tmp_path, False, files)
    assert rc == 0 and "1 passed, 1 skipped" in log, log


def test_verdicts():
    assert skip_verdict(GPU_SKIP_REASON, gpu_marked=True) is None
    assert skip_verdict(GPU_SKIP_REASON, gpu_marked=False) is not None  # the reason alone does not allow it
    assert "pyproject.toml" in skip_verdict("could not import 'xxhash': No module named 'xxhash'", False)
    assert "allows no skip" in skip_verdict("no C compiler", False)


def test_ci_build_problems():
    full = {"zstd": {"usable": True}, "io_uring": {"usable": True}, "test_hooks": True}
    assert ci_build_problems(full) == []
    lacking = {"zstd": {"usable": False, "detail": "not found"}, "io_uring": {"usable": True}, "test_hooks": False}
    problems = ci_build_problems(lacking)
    assert len(problems) == 2 and "zstd" in problems[0] and "TOKENFEED_TEST_HOOKS=1" in problems[1]
