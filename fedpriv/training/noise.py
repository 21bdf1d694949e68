"""Where a training run's noise comes from: the run's seed (a simulation) or a secret (``--secure-noise``).

A simulation draws its DP noise and its sampling from ``cfg.seed``: anyone with the seed (written
in ``config.json``) recomputes the noise, so every guarantee it prints says so
(:data:`fedpriv.privacy.streams.SIMULATION_NOTE`). With ``[privacy] secure_noise = true`` (central
DP-SGD) or ``[federated.dp] secure_noise = true`` (DP-FedAvg), or ``--secure-noise`` on the command
line, the DP noise and the batch or cohort sampling come from a secret of 128 bits instead
(:class:`fedpriv.privacy.streams.NoiseSeed`; the noise is drawn under a 64-bit threefry key derived
from it, so recomputing it costs a search of 2^64 keys), keyed to the run by HMAC over its config
(:func:`run_identity`) and a nonce drawn when it starts (:func:`fresh_nonce`, recorded in
``config.json`` and read back by a resume): two runs under one secret never share noise, not even
two starts of one config on two versions of the data, whose released models' difference would
otherwise cancel the noise and leave the users that differ; the initial parameters and the
canaries still come from the seed (they do not depend on the data).

The secret is never written. It is read from the environment variable :data:`SECRET_ENV` (32 or
more hex digits, e.g. ``python -c "import secrets; print(secrets.token_hex(16))"``) or, when that is
unset, drawn from the OS's CSPRNG. Only its SHA-256 is recorded (``config.json``, ``"noise"``), so
a resumed run refuses in one line unless it is given the same secret again: a run started
without :data:`SECRET_ENV` cannot be resumed.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fedpriv.config import TRAINING_AUDIT_KEYS
from fedpriv.errors import ConfigError
from fedpriv.privacy.streams import NoiseSeed
from fedpriv.rundir import RunDir

#: The environment variable that holds a --secure-noise run's secret (hex, >= 128 bits).
SECRET_ENV = "FEDPRIV_NOISE_SECRET"
#: How a secure run's noise is keyed to it (recorded; a resume under another keying is refused).
KEYING = "hmac-sha256(secret, run config, run nonce) v2"
#: Bytes of the nonce a secure run draws when it starts (public: useless without the secret).
NONCE_BYTES = 16



def secure_noise(cfg: Any) -> bool:
    """Whether the experiment asks for secret noise (``[privacy]`` or ``[federated.dp]``)."""
    fdp = cfg.federated.dp if cfg.federated is not None else None
    return bool((cfg.privacy is not None and cfg.privacy.secure_noise) or (fdp is not None and fdp.secure_noise))


def read_secret() -> bytes | None:
    """The secret of :data:`SECRET_ENV` (None when unset); a malformed one is refused."""
    text = os.environ.get(SECRET_ENV)
    if text is None:
        return None
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        raise ConfigError(f"{SECRET_ENV} must be hex digits (e.g. the output of secrets.token_hex(16))") from None
    if len(secret) < 16:
        raise ConfigError(f"{SECRET_ENV} holds {len(secret) * 8} bits; a noise secret needs at least 128 (32 hex digits)")
    return secret


def noise_seed(cfg: Any, run_dir: str | os.PathLike[str] | None = None) -> NoiseSeed:
    """The run's :class:`NoiseSeed`: ``cfg.seed`` for a simulation; for a secure run the secret of
    :data:`SECRET_ENV` (or a fresh one from ``os.urandom``), keyed to the run: its config
    (:func:`run_identity`) and its nonce, the one ``run_dir`` records when it holds a checkpoint
    (a resume), else a fresh one (:func:`fresh_nonce`)."""
    if not secure_noise(cfg):
        return NoiseSeed.simulation(cfg.seed)
    secret = read_secret()
    nonce = resumed_nonce(run_dir) or fresh_nonce()
    return NoiseSeed.from_secret(secret if secret is not None else os.urandom(16), run_identity(cfg) + b"\x00" + nonce, nonce.hex())


def fresh_nonce() -> bytes:
    """The nonce of a secure run that starts: :data:`NONCE_BYTES` from the OS's CSPRNG."""
    return os.urandom(NONCE_BYTES)


def resumed_nonce(run_dir: str | os.PathLike[str] | None) -> bytes | None:
    """The nonce ``run_dir``'s ``config.json`` records, when the directory holds a checkpoint to
    resume; None otherwise (a run keyed before nonces, or a malformed record: its resume is then
    refused by :func:`check_secret_on_resume`, whose run digest will not match)."""
    if run_dir is None:
        return None
    run = RunDir(run_dir)
    if run.checkpoint_meta() is None:
        return None
    stored = ((run.config_meta() or {}).get("noise") or {}).get("nonce")
    try:
        nonce = bytes.fromhex(stored) if isinstance(stored, str) else None
    except ValueError:
        return None
    return nonce if nonce and len(nonce) == NONCE_BYTES else None


def run_identity(cfg: Any) -> bytes:
    """What tells one run's secure noise from another's under one secret: the config as trained
    (canonical JSON), without the keys a resumed run may change (the engine, Flower's settings,
    the audit: :data:`fedpriv.training.loop.RESUMABLE_CHANGES`). :func:`noise_seed` appends the
    run's nonce, so that a resume draws the same noise and any other run (another seed, grid cell
    or tuning trial, or the same config started again) independent noise."""
    raw = cfg.model_dump(mode="json")
    raw["audit"] = {k: v for k, v in (raw.get("audit") or {}).items() if k in TRAINING_AUDIT_KEYS}
    for key in ("engine", "flower"):
        (raw.get("federated") or {}).pop(key, None)
    return json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()


def noise_meta(noise: NoiseSeed) -> dict[str, Any]:
    """What ``config.json`` records about the noise: nothing for a simulation (its seed is the
    config's); for a secure run the secret's SHA-256 (never the secret), the keying, the run's
    nonce (which a resume reads back) and the SHA-256 of what the noise is keyed to."""
    if not noise.secure:
        return {}
    return {"noise": {"secure": True, "secret_sha256": noise.fingerprint, "keying": KEYING, "nonce": noise.nonce, "run_sha256": noise.run_digest}}


def check_secret_on_resume(run_dir: Any, noise: NoiseSeed) -> None:
    """Refuse, before any training, to resume a secure run (a checkpoint exists) without the same
    secret it started with."""
    run = RunDir(run_dir)
    if not noise.secure or run.checkpoint_meta() is None:
        return
    stored = (run.config_meta() or {}).get("noise") or {}
    old = stored.get("secret_sha256")
    if old == noise.fingerprint:
        if stored.get("keying") != KEYING or stored.get("run_sha256") != noise.run_digest:
            # the same secret, keyed otherwise (an older fedpriv, or a config whose dump changed): the
            # replayed noise and sampling would not be those the run drew, and its epsilon would not hold
            raise ConfigError(f"{run.path}: this --secure-noise run's noise was keyed to it differently ({stored.get('keying') or 'before runs were keyed'}); "
                              "resuming would draw other noise and sampling than it used: finish it with the fedpriv that started it, or use a new run directory")
        return
    if os.environ.get(SECRET_ENV) is None:
        raise ConfigError(f"{run.path}: resuming a --secure-noise run needs its secret: set {SECRET_ENV} to the value the run started with (it is never stored), or use a new run directory")
    raise ConfigError(f"{run.path}: {SECRET_ENV} is not the secret this --secure-noise run started with (its SHA-256 differs); use that secret or a new run directory")


def adds_noise(cfg: Any) -> bool:
    """Whether the run adds DP noise that ``secure_noise`` covers (DP-SGD or DP-FedAvg)."""
    return bool((cfg.privacy is not None and cfg.privacy.private) or (cfg.federated is not None and cfg.federated.dp is not None))


def with_secure_noise(cfg: Any, where: str = "--secure-noise") -> Any:
    """``cfg`` with ``secure_noise = true`` in its DP section (``[privacy]`` or ``[federated.dp]``),
    re-validated; a run that adds no such noise is refused."""
    from fedpriv.config import ExperimentConfig

    if not adds_noise(cfg):
        raise ConfigError(f"{where}: experiment {cfg.name!r} adds no DP noise ([privacy] or [federated.dp]), so there is no noise to keep secret")
    raw = cfg.model_dump(mode="json")
    if cfg.privacy is not None:
        raw["privacy"]["secure_noise"] = True
    else:
        raw["federated"]["dp"]["secure_noise"] = True
    try:
        return ExperimentConfig.model_validate(raw)
    except Exception as e:  # a pydantic ValidationError: its first message, on one line
        msg = e.errors()[0]["msg"] if hasattr(e, "errors") else str(e)
        raise ConfigError(f"{where}: {msg.removeprefix('Value error, ')}") from None
