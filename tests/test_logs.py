"""Quiet logs: the known-harmless third-party messages, raised by the real libraries in a fresh
process, are filtered by default and shown with FEDPRIV_VERBOSE=1 (``fedpriv -v``); other
warnings still show; nothing written to a file carries a colour code."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NOISY = r'''
import logging, subprocess, warnings
from fedpriv.logs import setup
setup()
import jax
jax.devices()
subprocess.run(["true"], preexec_fn=lambda: None)          # a real fork (as Ray's): JAX warns
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp
rdp.RdpAccountant().compose(dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0)))  # absl: failed to converge
from flwr.supercore.logger import log, warn_deprecated_feature
warn_deprecated_feature("The `run_simulation` function is deprecated and will be removed in a future version of Flower.")
log(logging.WARNING, "Manually terminating %s", "ClientAppActor")   # what Flower's Ray actors log at the end
log(logging.WARNING, "a Flower warning fedpriv does not know")
warnings.warn_explicit("Tip: In future versions of Ray ...", FutureWarning, "worker.py", 1, module="ray._private.worker")
warnings.warn("a warning of fedpriv's own", UserWarning)
'''
KNOWN = ["os.fork() was called", "_compute_log_a_frac failed to converge", "DEPRECATED FEATURE", "Manually terminating ClientAppActor", "Tip: In future versions of Ray"]


def run(verbose: bool) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "FEDPRIV_VERBOSE": "1" if verbose else "0"}
    res = subprocess.run([sys.executable, "-c", NOISY], env=env, capture_output=True, text=True, timeout=300, check=True)
    return res.stderr


def test_known_harmless_messages_are_quiet_unless_verbose():
    quiet, loud = run(False), run(True)
    for message in KNOWN:
        assert message not in quiet, message
        assert message in loud, message
    for other in ("a Flower warning fedpriv does not know", "a warning of fedpriv's own"):
        assert other in quiet and other in loud
    assert "\x1b[" not in quiet and "\x1b[" not in loud  # stderr is a pipe: no colour codes
