"""`fedpriv privacy epsilon|calibrate|batch-sweep`: every event type answers with --json."""

import json

import pytest

from fedpriv.cli import main
from fedpriv.privacy.accounting import GaussianSteps, epsilon_for

EVENTS = {
    "dpsgd-poisson": (["-B", "256", "-N", "60000"], GaussianSteps("poisson", 1.1, 60000, 256, 500), ["RDP", "PLD"]),
    "dpsgd-fixed": (["-B", "256", "-N", "60000"], GaussianSteps("fixed", 1.1, 60000, 256, 500), ["RDP"]),
    "dpfedavg-fixed": (["-B", "500", "-N", "20000"], GaussianSteps("fixed", 1.1, 20000, 500, 500, unit="user"), ["RDP"]),
    "dpfedavg-poisson": (["-B", "500", "-N", "20000"], GaussianSteps("poisson", 1.1, 20000, 500, 500, unit="user"), ["RDP", "PLD"]),
    # (20 steps: PLD of 500 unsampled compositions at z 1.1 takes 20 s for the same check)
    "no-sampling": (["-N", "1000"], GaussianSteps("none", 1.1, 1000, 1000, 20), ["RDP", "PLD"]),
}


@pytest.mark.parametrize("event", sorted(EVENTS))
def test_epsilon_for_each_event(event, capsys):
    args, expected, accountants = EVENTS[event]
    assert main(["privacy", "epsilon", "-e", event, "-z", "1.1", "--steps", str(expected.steps), "--delta", "1e-5", "--json", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    got = {a["accountant"]: a for a in out["answers"]}
    assert sorted(got) == sorted(accountants)
    for name, a in got.items():
        assert a["epsilon"] == pytest.approx(epsilon_for(expected, 1e-5, name.lower()).epsilon, rel=1e-12)
        assert a["relation"] == expected.relation and a["unit"] == expected.unit
        assert a["sampling"] and a["guarantee"].startswith("epsilon = ")
        assert (a["rdp_order"] is not None) == (name == "RDP")


def test_delta_for_epsilon_and_sharding(capsys):
    assert main(["privacy", "epsilon", "-e", "dpsgd-poisson", "-z", "1", "-N", "1000", "-B", "10", "--steps", "100", "--epsilon", "1", "--json", "--accountant", "rdp"]) == 0
    a = json.loads(capsys.readouterr().out)["answers"][0]
    assert a["epsilon"] == 1 and 0 < a["delta"] < 1
    assert main(["privacy", "epsilon", "-e", "dpsgd-poisson", "-z", "1", "-N", "1000", "-B", "10", "--steps", "100", "--delta", "1e-5", "--shards", "4", "--micro-steps", "4", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["answers"][0]
    assert a["effective_noise_multiplier"] == pytest.approx(4.0)


def test_an_answered_delta_at_least_one_over_n_is_said_to_promise_nothing(capsys):
    """An asked delta >= 1/N is refused; an answered one (--epsilon) is printed with what it means."""
    argv = ["privacy", "epsilon", "-e", "dpfedavg-fixed", "-z", "0.7", "-N", "100000", "-B", "1000", "--steps", "1", "--json", "--accountant", "rdp"]
    assert main([*argv, "--epsilon", "0.5"]) == 0
    out = json.loads(capsys.readouterr().out)
    d = out["answers"][0]["delta"]
    assert d > 1e-5 and out["note"] == (f"delta = {d:.3g} >= 1/N = 1e-05 (N = 100000 users): at epsilon 0.5 this mechanism does not rule out "
                                        "publishing one user's data in the clear; it is no privacy guarantee for any one user")
    assert main([*argv, "--epsilon", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["answers"][0]["delta"] < 1e-5 and "note" not in out


@pytest.mark.parametrize("event, unit, expected", [("dpsgd-poisson", "user", "user"), ("dpsgd-fixed", "user", "user"), ("dpsgd-poisson", "example", "example"),
                                                    ("dpsgd-poisson", None, "example"), ("dpfedavg-poisson", None, "user"), ("dpfedavg-fixed", "user", "user")])
def test_unit_is_honoured_for_dp_sgd_events_and_is_the_user_for_dp_fedavg(capsys, event, unit, expected):
    given = [] if unit is None else ["--unit", unit]
    assert main(["privacy", "epsilon", "-e", event, "-z", "1", "-N", "1000", "-B", "10", "--steps", "10", "--delta", "1e-5", *given, "--json", "--accountant", "rdp"]) == 0
    assert json.loads(capsys.readouterr().out)["answers"][0]["unit"] == expected


@pytest.mark.parametrize("event", ["dpfedavg-poisson", "dpfedavg-fixed", "banded-mf-fedavg"])
def test_unit_example_with_a_dp_fedavg_event_is_refused_not_read_as_user(capsys, event):
    """It was silently answered per user, under an example-level question."""
    assert main(["privacy", "epsilon", "-e", event, "-z", "1", "-N", "1000", "-B", "10", "--steps", "10", "--delta", "1e-5", *(["--bands", "1"] if "banded" in event else []), "--unit", "example"]) == 2
    assert f"--unit example: {event} is DP-FedAvg, whose unit is the user" in capsys.readouterr().err


def test_an_unknown_unit_is_refused(capsys):
    assert main(["privacy", "epsilon", "-e", "dpsgd-poisson", "-z", "1", "-N", "1000", "-B", "10", "--steps", "10", "--delta", "1e-5", "--unit", "banana"]) == 2
    assert "--unit: example or user, got 'banana'" in capsys.readouterr().err


def test_calibrate_and_sweep(capsys):
    assert main(["privacy", "calibrate", "-e", "dpsgd-poisson", "--target-epsilon", "2", "--delta", "1e-5", "-N", "60000", "-B", "256", "--steps", "1000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["answers"][0]["epsilon"] <= 2 and out["calibrated_noise_multiplier"] > 0
    assert main(["privacy", "batch-sweep", "-e", "dpsgd-poisson", "-z", "1", "-N", "50000", "-B", "256", "--steps", "100", "--batches", "256,1024", "--delta", "1e-5", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["noise_multiplier"] for r in rows] == pytest.approx([1.0, 2.0])
    assert main(["privacy", "batch-sweep", "-e", "dpfedavg-fixed", "-z", "1", "-N", "50000", "-B", "256", "--steps", "100", "--batches", "256,1024", "--delta", "1e-5"]) == 0
    footer = " ".join(capsys.readouterr().out.split())  # the table's footer names the sampling, not only the relation
    assert "user-level, replace-one user; sampling at B = 256: fixed-size batches of exactly 256 users of 50000, sampled without replacement" in footer


@pytest.mark.parametrize(
    "args, message",
    [
        (["-e", "dpfedavg-fixed", "-z", "1", "-N", "100", "-B", "500", "--steps", "5", "--delta", "1e-5"], "m = 500 users without replacement from N = 100"),
        (["-e", "dpsgd-poisson", "-z", "0", "-N", "100", "-B", "5", "--steps", "5", "--delta", "1e-5"], "--noise-multiplier must be a finite number in [0.001, 1e+06]"),
        (["-e", "dpsgd-poisson", "-z", "1e-6", "-N", "100", "-B", "5", "--steps", "5", "--delta", "1e-5"], "below it epsilon is astronomically large"),  # (once a ZeroDivisionError)
        (["-e", "dpsgd-poisson", "-z", "1", "-N", "100", "-B", "5", "--steps", "5", "--delta", "1.5"], "--delta must be a finite number in (0, 1), got 1.5"),
        (["-e", "dpsgd-poisson", "-z", "1", "-N", "100", "-B", "5", "--steps", "0", "--delta", "1e-5"], "--steps must be an integer in [1, 1e+12], got 0"),
        (["-e", "dpsgd-poisson", "-z", "1", "-N", "100", "--steps", "5", "--delta", "1e-5"], "--batch is required"),
        (["-e", "dpsgd-fixed", "-z", "1", "-N", "100", "-B", "5", "--steps", "5", "--delta", "1e-5", "--accountant", "pld"], "not available"),
        (["-e", "dpsgd-poisson", "-z", "1", "-N", "100", "-B", "5", "--steps", "5"], "exactly one of --delta"),
    ],
)
def test_refusals_are_one_line(args, message, capsys):
    assert main(["privacy", "epsilon", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedpriv: error:") and message in err and "\n" not in err


def test_human_output_states_assumptions(capsys):
    assert main(["privacy", "epsilon", "-e", "dpfedavg-fixed", "-z", "1", "-N", "20000", "-B", "500", "--steps", "10", "--delta", "1e-6"]) == 0
    out = capsys.readouterr().out
    assert "replace-one user" in out and "without replacement" in out and "sensitivity is 2C" in out


# ---- issue 31: every numeric option through one validator (these used to end in internal errors) ----
EPSILON = ["privacy", "epsilon", "-e", "dpsgd-poisson", "-N", "1000", "-B", "10", "--steps", "10"]
SWEEP = ["privacy", "batch-sweep", "-e", "dpsgd-poisson", "-z", "1", "-N", "1000", "-B", "10", "--steps", "10", "--delta", "1e-5"]
CALIBRATE = ["privacy", "calibrate", "-e", "dpsgd-poisson", "-N", "1000", "-B", "10", "--steps", "10"]


@pytest.mark.parametrize(
    "argv, message",
    [
        ([*EPSILON, "-z", "1e308", "--delta", "1e-5"], "--noise-multiplier must be a finite number in [0.001, 1e+06] (below it epsilon is astronomically large; above it epsilon is 0 to float precision), got 1e+308"),  # OverflowError
        ([*EPSILON, "-z", "nan", "--delta", "1e-5"], "--noise-multiplier must be a finite number in [0.001, 1e+06]"),
        ([*EPSILON, "-z", "1", "--epsilon", "inf"], "--epsilon must be a finite number > 0, got inf"),
        ([*EPSILON, "-z", "1", "--delta", "1e-5", "--shards", "100000000000000000000"], "--shards must be an integer in [1, 1e+06], got 100000... (21 digits)"),
        ([*SWEEP, "--batches", "10,20", "--epochs", "inf"], "--epochs must be a finite number > 0 (steps = ceil(epochs * ceil(N / B))), got inf"),  # OverflowError
        ([*SWEEP, "--batches", "10,20", "--epochs", "nan"], "--epochs must be a finite number > 0"),  # ValueError
        ([*SWEEP, "--batches", "10,20", "--epochs", "0"], "--epochs must be a finite number > 0 (steps = ceil(epochs * ceil(N / B))), got 0"),  # printed "steps 1", exit 0
        ([*SWEEP, "--batches", "10,20", "--epochs", "-1"], "--epochs must be a finite number > 0"),
        ([*SWEEP, "--batches", "10,nan"], "--batches must be a finite number > 0, got nan"),
        ([*SWEEP, "--batches", "10,1e-310", "--epochs", "1"], "epochs * N / B = 1 * 1000 / 1e-310 steps overflows"),  # OverflowError
        ([*CALIBRATE, "--target-epsilon", "nan", "--delta", "1e-5"], "--target-epsilon must be a finite number > 0, got nan"),
    ],
)
def test_every_numeric_option_is_checked_for_range_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedpriv: error: ") and err.count("\n") == 1 and message in err, err


def test_the_validator_knows_every_numeric_option_of_every_privacy_command():
    """A new numeric option must get a range in OPTION_RANGES, or check_options fails on it."""
    import click
    import typer.main

    from fedpriv.cli.privacy import OPTION_RANGES, privacy_app

    group = typer.main.get_command(privacy_app)
    numeric = {
        p.opts[0] if p.opts[0].startswith("--") else p.opts[-1]
        for cmd in group.commands.values()
        for p in cmd.params
        if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))
    } | {"--batches"}
    assert numeric == set(OPTION_RANGES)


def _direct_epsilon(coefs, population, batch, steps, z, delta, accountant):
    """jax-privacy's min-separation sensitivity and dp_accounting's Gaussian, by hand."""
    import math

    import dp_accounting
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax_privacy.matrix_factorization import toeplitz

    from fedpriv.privacy.accounting import PLD_DISCRETIZATION, RDP_ORDERS

    b = population // batch
    c = np.zeros(steps)
    c[: min(steps, len(coefs))] = np.asarray(coefs, np.float64)[:steps]
    with jax.enable_x64(True):
        sq = float(toeplitz.minsep_sensitivity_squared(jnp.asarray(c), b, math.ceil(steps / b), n=steps))
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION) if accountant == "PLD" else dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS))
    acc.compose(dp_accounting.GaussianDpEvent(z / math.sqrt(sq)))
    return acc.get_epsilon(delta)


def test_banded_mf_epsilon_equals_jax_privacy_and_dp_accounting(capsys):
    import jax.numpy as jnp
    import numpy as np
    from jax_privacy.matrix_factorization import toeplitz

    argv = ["privacy", "epsilon", "-e", "banded-mf-fedavg", "--bands", "4", "-z", "2.5", "-N", "5000", "-B", "100", "--steps", "120", "--delta", "1e-6", "--json"]
    assert main([*argv, "--max-participations", "3", "--min-separation", "50"]) == 0
    out = json.loads(capsys.readouterr().out)
    coefs = np.asarray(toeplitz.optimal_max_error_strategy_coefs(4), np.float64)
    coefs /= np.linalg.norm(coefs)
    for a in out["answers"]:
        assert a["epsilon"] == pytest.approx(_direct_epsilon(coefs, 5000, 100, 120, 2.5, 1e-6, a["accountant"]), rel=1e-12)
        assert a["relation"] == "zero-out-one" and "k = 3" in a["sampling"] and "b = 50" in a["sampling"]
    assert sorted(a["accountant"] for a in out["answers"]) == ["PLD", "RDP"]
    assert main([*argv, "--max-participations", "2"]) == 2  # 120 rounds over 50 groups: some user takes part 3 times
    err = capsys.readouterr().err
    assert err.startswith("fedpriv: error: --max-participations = 2: 120 steps over 50 groups of 100") and err.count("\n") == 1


def test_a_correlated_dpsgd_event_takes_its_unit_and_fedavg_protects_users(capsys):
    """`--unit user` (user-level DP-SGD) is honoured by the DP-SGD events, not silently read as example-level;
    the unit does not change epsilon; a DP-FedAvg event protects users."""
    argv = ["privacy", "epsilon", "--bands", "2", "-z", "2.5", "-N", "5000", "-B", "100", "--steps", "120", "--delta", "1e-6", "--json"]
    answers = {}
    for event, unit in (("banded-mf-dpsgd", "example"), ("banded-mf-dpsgd", "user"), ("banded-mf-fedavg", "user")):
        assert main([*argv, "-e", event, "--unit", unit]) == 0
        answers[event, unit] = json.loads(capsys.readouterr().out)["answers"]
    assert [a["unit"] for a in answers["banded-mf-dpsgd", "example"]] == ["example"] * 2
    assert [a["unit"] for a in answers["banded-mf-dpsgd", "user"]] == ["user"] * 2
    assert [a["unit"] for a in answers["banded-mf-fedavg", "user"]] == ["user"] * 2
    assert [a["epsilon"] for a in answers["banded-mf-dpsgd", "user"]] == [a["epsilon"] for a in answers["banded-mf-dpsgd", "example"]]


@pytest.mark.slow
def test_blt_epsilon_and_calibration_equal_jax_privacy_and_dp_accounting(capsys):
    import jax
    import numpy as np
    from jax_privacy.matrix_factorization import buffered_toeplitz

    assert main(["privacy", "calibrate", "-e", "blt-dpsgd", "--target-epsilon", "8", "--delta", "1e-5", "-N", "48700", "-B", "1000", "--steps", "100", "--accountant", "pld", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    z = out["calibrated_noise_multiplier"]
    with jax.enable_x64(True):
        coefs = np.asarray(buffered_toeplitz.BufferedToeplitz.from_rational_approx_to_sqrt_x(4).toeplitz_coefs(100), np.float64)
    at_z = _direct_epsilon(coefs, 48700, 1000, 100, z, 1e-5, "PLD")  # (a PLD by hand costs seconds: computed once)
    assert at_z <= 8.0 < _direct_epsilon(coefs, 48700, 1000, 100, z * 0.999, 1e-5, "PLD")
    assert out["answers"][0]["epsilon"] == pytest.approx(at_z, rel=1e-9)


def _amplified_by_hand(coefs, population, batch, groups, steps, z, delta, accountant):
    """dp_accounting's k = ceil(steps / b) Poisson-subsampled Gaussians, q = B / (N // b), multiplier z / ||C's first column||."""
    import math

    import dp_accounting
    import numpy as np

    from fedpriv.privacy.accounting import PLD_DISCRETIZATION, RDP_ORDERS

    one = dp_accounting.PoissonSampledDpEvent(batch / (population // groups), dp_accounting.GaussianDpEvent(z / float(np.linalg.norm(np.asarray(coefs)[:steps]))))
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION) if accountant == "PLD" else dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS))
    return acc.compose(dp_accounting.SelfComposedDpEvent(one, math.ceil(steps / groups))).get_epsilon(delta)


def test_amplified_banded_mf_epsilon_equals_dp_accounting(capsys):
    """`--sampling cyclic-poisson`: b = --groups (default --bands); the answers equal the composition by hand."""
    import numpy as np
    from jax_privacy.matrix_factorization import toeplitz

    coefs = np.asarray(toeplitz.optimal_max_error_strategy_coefs(3), np.float64)
    coefs /= np.linalg.norm(coefs)
    argv = ["privacy", "epsilon", "-e", "banded-mf-fedavg", "--bands", "3", "--sampling", "cyclic-poisson", "-z", "1.2", "-N", "5000", "-B", "50", "--steps", "40", "--delta", "1e-6", "--json"]
    for extra, groups, accountants in (([], 3, ["PLD", "RDP"]), (["--groups", "5", "--accountant", "rdp"], 5, ["RDP"])):
        assert main([*argv, *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        assert sorted(a["accountant"] for a in out["answers"]) == accountants
        for a in out["answers"]:
            assert a["epsilon"] == pytest.approx(_amplified_by_hand(coefs, 5000, 50, groups, 40, 1.2, 1e-6, a["accountant"]), rel=1e-9)
            assert a["relation"] == "add-or-remove-one" and a["unit"] == "user" and f"b = {groups} groups" in a["sampling"]


def test_amplified_banded_mf_calibration_equals_dp_accounting(capsys):
    import numpy as np
    from jax_privacy.matrix_factorization import toeplitz

    calibrate = ["privacy", "calibrate", "-e", "banded-mf-dpsgd", "--bands", "2", "--sampling", "cyclic-poisson", "--target-epsilon", "3", "--delta", "1e-5",
                 "-N", "5000", "-B", "50", "--steps", "20", "--json"]
    assert main(calibrate) == 0
    z = json.loads(capsys.readouterr().out)["calibrated_noise_multiplier"]
    coefs2 = np.asarray(toeplitz.optimal_max_error_strategy_coefs(2), np.float64)
    coefs2 /= np.linalg.norm(coefs2)
    assert _amplified_by_hand(coefs2, 5000, 50, 2, 20, z, 1e-5, "RDP") <= 3.0 < _amplified_by_hand(coefs2, 5000, 50, 2, 20, z * 0.999, 1e-5, "RDP")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["-e", "blt-fedavg", "--sampling", "cyclic-poisson"], "--sampling cyclic-poisson amplifies banded MF only: BLT has infinitely many bands"),
        (["-e", "banded-mf-fedavg", "--bands", "4", "--sampling", "cyclic-poisson", "--groups", "3"], "--bands = 4 > --groups = 3: amplified banded MF needs at most b bands"),
        (["-e", "banded-mf-fedavg", "--bands", "2", "--groups", "3"], "--groups applies to --sampling cyclic-poisson"),
        (["-e", "banded-mf-fedavg", "--bands", "2", "--sampling", "cyclic-poisson", "--max-participations", "5"], "--max-participations = 5: 40 steps over b = 2 groups let one user take part up to 20 times"),
        (["-e", "dpfedavg-poisson", "--sampling", "cyclic-poisson"], "apply to the correlated-noise events, not dpfedavg-poisson"),
    ],
)
def test_amplified_refusals_are_one_line(extra, message, capsys):
    assert main(["privacy", "epsilon", "-z", "1.2", "-N", "5000", "-B", "50", "--steps", "40", "--delta", "1e-6", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedpriv: error: ") and err.count("\n") == 1 and message in err, err


@pytest.mark.slow
def test_optimized_coefficients_epsilon_equals_jax_privacy_and_dp_accounting(capsys):
    """`--coefficients optimized`: jax-privacy's banded optimizer for these steps (mean prefix-sum
    error; that the coefficients are its answer: tests/privacy/test_optimized.py), then the same
    hand computation on the coefficients the answer prints as for the fixed strategies (cyclic, and
    cyclic Poisson)."""
    import numpy as np
    from jax_privacy.matrix_factorization import toeplitz

    fixed = np.asarray(toeplitz.optimal_max_error_strategy_coefs(3), np.float64)
    argv = ["privacy", "epsilon", "-e", "banded-mf-fedavg", "--bands", "3", "-z", "2.5", "-N", "400", "-B", "100", "--steps", "12", "--delta", "1e-5",
            "--coefficients", "optimized", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    coefs = np.asarray(out["strategy"]["coefs"], np.float64)
    assert len(coefs) == 3 and np.linalg.norm(coefs) == pytest.approx(1.0, rel=1e-12) and not np.allclose(coefs, fixed / np.linalg.norm(fixed), atol=1e-3)
    assert "optimized strategy in " in captured.err
    for a in out["answers"]:
        assert a["epsilon"] == pytest.approx(_direct_epsilon(coefs, 400, 100, 12, 2.5, 1e-5, a["accountant"]), rel=1e-12)
        assert "numerically optimized by jax-privacy" in a["sampling"]
    assert main(["privacy", "epsilon", "-e", "banded-mf-fedavg", "--bands", "3", "--sampling", "cyclic-poisson", "--groups", "4", "-z", "1.2", "-N", "5000", "-B", "50",
                 "--steps", "12", "--delta", "1e-5", "--coefficients", "optimized", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for a in out["answers"]:
        assert a["epsilon"] == pytest.approx(_amplified_by_hand(coefs, 5000, 50, 4, 12, 1.2, 1e-5, a["accountant"]), rel=1e-9)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["-e", "banded-mf-fedavg", "--bands", "3", "--coefficients", "best"], "--coefficients: fixed or optimized, got 'best'"),
        (["-e", "dpfedavg-poisson", "--coefficients", "optimized"], "apply to the correlated-noise events, not dpfedavg-poisson"),
        (["-e", "banded-mf-dpsgd", "--bands", "5", "--coefficients", "optimized"], "--coefficients = 'optimized' with --bands = 5 > the cyclic schedule's groups N // m = 4"),
    ],
)
def test_optimized_refusals_are_one_line(extra, message, capsys):
    assert main(["privacy", "epsilon", "-z", "1.2", "-N", "400", "-B", "100", "--steps", "12", "--delta", "1e-6", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedpriv: error: ") and err.count("\n") == 1 and message in err, err
