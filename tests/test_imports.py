"""Start-up imports (docs/architecture.md, "Imports"): the entry points import none of the slow
libraries; each is imported by the function that uses it."""

import subprocess
import sys

#: What each process start would otherwise pay (about 1.5 s together on 2 cores).
SLOW = ("dp_accounting", "jax_privacy", "scipy.special", "scipy.stats", "scipy.signal", "matplotlib")
#: The modules processes start from: the CLI, the apps `flwr run .` loads, the runner, the trainers.
ENTRY_POINTS = ("fedpriv.cli", "fedpriv.runner.flower_app", "fedpriv.runner.store", "fedpriv.central.train", "fedpriv.engines.vectorized")


def test_entry_points_import_no_slow_library():
    code = f"import sys\nfor m in {ENTRY_POINTS!r}: __import__(m)\nprint(sorted(m for m in {SLOW!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_accounting_imports_dp_accounting_when_it_accounts():
    code = (
        "import sys\nfrom fedpriv.privacy.accounting import GaussianSteps, epsilon_for\n"
        "assert 'dp_accounting' not in sys.modules\n"
        "e = GaussianSteps(noise_multiplier=1.0, sampling='poisson', batch=10, population=1000, steps=10)\n"
        "print(epsilon_for(e, 1e-5).epsilon > 0, 'dp_accounting' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"], out
