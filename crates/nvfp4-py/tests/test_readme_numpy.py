"""The README's NumPy example runs as written on the CPU, without torch: the first ```python block
after the README's "## Python" section names this file, executed as it stands, its result checked
against the float64 reference of the values it quantized. And the folder the README's build
command writes the wheel to is one git ignores. The README is read next to tests/ (the staged GPU
folder of `scripts/stage-gpu.sh`) or at the repository root; a missing README fails."""

import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

from reference import gemm_ref

HERE = pathlib.Path(__file__).resolve().parent


def python_section():
    for path in (HERE.parent / "README.md", HERE.parents[2] / "README.md"):
        if path.is_file():
            text = path.read_text()
            break
    else:
        pytest.fail("README.md is neither next to tests/ (staged) nor at the repository root")
    section = text.split("\n## Python\n", 1)
    assert len(section) == 2, "README.md has no '## Python' section"
    return section[1].split("\n## ", 1)[0]


def numpy_example():
    named = python_section().split("tests/test_readme_numpy.py", 1)
    assert len(named) == 2, "the README's Python section does not name tests/test_readme_numpy.py"
    block = re.search(r"```python\n(.*?)```", named[1], re.S)
    assert block, "no ```python block follows the README's mention of tests/test_readme_numpy.py"
    return block.group(1)


def test_readme_numpy_example_runs_as_written(capsys):
    code = numpy_example()
    assert "torch" not in code, "the NumPy example must run without torch"
    namespace = {"__name__": "__readme__"}
    exec(compile(code, "README.md (## Python, NumPy)", "exec"), namespace)
    assert capsys.readouterr().out.strip(), "the example prints its comparison"
    ns = namespace
    # The example applies the global scales as alpha: its result is the exact reference of the
    # values and scales it quantized, times xg * wg.
    want = gemm_ref(ns["xv"], ns["xs"], ns["wv"], ns["ws"], alpha=np.float64(np.float32(ns["xg"][0] * ns["wg"][0])))
    np.testing.assert_array_equal(ns["y"].view(np.uint16), want.view(np.uint16))
    assert ns["wb"].shape == (1, 2, 8, 512)


def test_readme_wheel_folder_is_ignored():
    build = re.search(r"maturin build .*?-o (\S+)", python_section())
    assert build, "the README's Python section has no `maturin build ... -o DIR` command"
    root = HERE.parents[2]
    # Only where this file stands in the repository (crates/nvfp4-py/tests): a staged copy may lie
    # inside another checkout, whose ignore rules are not the repository's.
    in_repo = HERE.parent.name == "nvfp4-py" and HERE.parents[1].name == "crates"
    if shutil.which("git") is None or not in_repo or not (root / ".git").exists():
        pytest.skip("not in a git checkout of the repository (a staged test folder)")
    wheel = f"{build.group(1)}/nvfp4-0.1.0-cp39-abi3-manylinux_2_34_x86_64.whl"
    ignored = subprocess.run(["git", "check-ignore", "-q", wheel], cwd=root)
    assert ignored.returncode == 0, f"git does not ignore {wheel}, which the README's build command writes"
