"""pfl-research's side (runs in .bench-envs/pfl: pfl 0.6.0 with its PyTorch backend, torch CPU).

    .bench-envs/pfl/bin/python benchmarks/peers/pfl_peer.py X.npz [--threads N]

A line-oriented server (benchmarks/peers/protocol.py) for FedAvg and DP-FedAvg on the NWP task
exported by run.py's ``pfl`` section. The .npz holds the initial weights of fedpriv's NWP model
(fedpriv_side.export_nwp's layout), every user's examples as flat rows (``rows`` (E, L + 1) ids,
``offsets``/``counts`` per user; for the equivalence round each user's rows are in the order of
fedpriv's round-1 plan, so that batches of B cut in order are fedpriv's round-1 batches), the
cohort of each timed round (``cohort<k>``: user indices, fedpriv's sampler's; k = m * 10,000 + round; ``cohort1``: the equivalence round's), and ``z``, ``clip``,
``batch``, ``client_lr``.

The algorithm is pfl's own simulation: ``pfl.algorithm.FederatedAveraging`` with a
``pfl.model.pytorch.PyTorchModel`` (local ``torch.optim.SGD`` at ``client_lr``, one local epoch of
batches of B in order; central ``torch.optim.SGD`` at 1.0, so the averaged delta is applied as it
is, as fedpriv's default server optimizer), run round by round through
``pfl.aggregate.simulate.SimulatedBackend.gather_results`` and
``FederatedAveraging.process_aggregated_statistics`` (what ``FederatedAlgorithm.run`` does each
central iteration, without its evaluation and callbacks), with postprocessors

* FedAvg: ``WeightByDatapoints`` (the deltas' average weighted by example counts, as fedpriv's
  ``fedavg``);
* DP-FedAvg: ``WeightByUser`` then ``CentrallyAppliedPrivacyMechanism(GaussianMechanism(S, z))``:
  each delta clipped to L2 norm S (over all trainable tensors), summed with weight 1, N(0, (z S)^2)
  per coordinate added to the sum, divided by the cohort size (fedpriv's ``dp-fedavg``).

The model is the NWP LSTM ported to torch as in opacus_peer.py (one gate bias: torch's
``bias_hh`` held at 0 and frozen, so pfl's statistics do not include it); loss per example the
mean cross-entropy over its non-pad targets, per batch the mean over its examples (fedpriv's
NWPTask). The cohort's users come from a ``FederatedDatasetBase`` that yields the round's
exported cohort (the same users as fedpriv's round), each user's ``pfl.data.dataset.Dataset``
sliced from the flat rows when the cohort reaches it.

Commands: ``{"cmd": "equiv", "strategy": "fedavg"|"fedavg-clip"|"dp-fedavg", "out": PATH[, "clip": S,
"z": Z]}``: one round over ``cohort1`` from the exported weights (``fedavg-clip``: DP-FedAvg's
clip without noise); the new weights go to PATH (.npz, export layout); answers the cohort's size.
``{"cmd": "rounds", "variant": "fedavg"|"dp-fedavg", "rounds": [k, ...]}``: one round on each of
those cohorts, in order, from the exported weights (a fresh model); answers each round's wall seconds and the peak
resident memory of this process during them (``VmHWM`` after resetting it, MiB).
``{"cmd": "epsilon", "configs": [...]}``: pfl's accountants (RDP, PLD, PRV) on each config
``{"q", "sigma", "steps", "delta"}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

NAMES = ["embed", "lstm_wi", "lstm_wh", "lstm_b", "projection_kernel", "projection_bias", "output_kernel", "output_bias"]


def proc_status(key: str) -> float:
    """VmRSS / VmHWM of this process in MiB (Linux). (A copy of benchmarks/federated_scale.py's: this
    file runs in pfl's own environment, which cannot import fedpriv's benchmarks.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class PflPeer:
    def __init__(self, path: str):
        import numpy as np
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        self.np, self.torch = np, torch
        w = dict(np.load(path))
        self.w = w
        self.z, self.S, self.B, self.lr = float(w["z"]), float(w["clip"]), int(w["batch"]), float(w["client_lr"])
        self.rows, self.offsets, self.counts = w["rows"].astype(np.int64), w["offsets"].astype(np.int64), w["counts"].astype(np.int64)
        self.cohorts = {int(k[6:]): w[k].astype(np.int64) for k in w if k.startswith("cohort")}
        self.trows = torch.from_numpy(self.rows)  # users' datasets are views of it (pfl's to_tensor keeps a tensor's dtype)

        class NWP(nn.Module):
            """fedpriv's NWP LSTM in torch, with pfl's ``loss``/``metrics`` methods."""

            def __init__(self):
                super().__init__()
                V, E = w["embed"].shape
                H, P = w["lstm_wh"].shape[0], w["projection_kernel"].shape[1]
                self.embed = nn.Embedding(V, E)
                self.lstm = nn.LSTM(E, H, batch_first=True)
                self.projection = nn.Linear(H, P)
                self.output = nn.Linear(P, V)
                self.reset()

            def reset(self):
                t = lambda a: torch.tensor(np.asarray(a, np.float32))  # noqa: E731
                H = w["lstm_wh"].shape[0]
                sd = {"embed.weight": t(w["embed"]), "lstm.weight_ih_l0": t(w["lstm_wi"].T), "lstm.weight_hh_l0": t(w["lstm_wh"].T),
                      "lstm.bias_ih_l0": t(w["lstm_b"]), "lstm.bias_hh_l0": torch.zeros(4 * H),
                      "projection.weight": t(w["projection_kernel"].T), "projection.bias": t(w["projection_bias"]),
                      "output.weight": t(w["output_kernel"].T), "output.bias": t(w["output_bias"])}
                self.load_state_dict(sd)
                self.lstm.bias_hh_l0.requires_grad_(False)  # fedpriv (like Keras) has ONE gate bias

            def forward(self, x):
                h, _ = self.lstm(self.embed(x))
                return self.output(self.projection(h))

            def per_example(self, x, y):
                logits = self(x)
                nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none").reshape(y.shape)
                valid = (y != 0).float()
                return (nll * valid).sum(1) / valid.sum(1).clamp(min=1.0)

            def loss(self, x, y, eval=False):  # noqa: A002  (pfl's signature)
                self.eval() if eval else self.train()
                return self.per_example(x, y).mean()

            def metrics(self, x, y, eval=False):  # noqa: A002
                from pfl.metrics import Weighted

                with torch.no_grad():
                    s = float(self.per_example(x, y).sum())
                return {"loss": Weighted(s, len(x))}

        self.NWP = NWP

    def user_dataset(self, u: int):
        from pfl.data.dataset import Dataset

        r = self.trows[self.offsets[u] : self.offsets[u] + self.counts[u]]
        return Dataset(raw_data=[r[:, :-1], r[:, 1:]], user_id=str(u))

    def build(self, variant: str, clip: float | None = None, z: float | None = None):
        """(pfl model, algorithm, backend whose cohort the caller sets) of ``variant``."""
        import torch
        from pfl.aggregate.simulate import SimulatedBackend
        from pfl.aggregate.weighting import WeightByDatapoints, WeightByUser
        from pfl.algorithm import FederatedAveraging
        from pfl.data.federated_dataset import FederatedDatasetBase
        from pfl.model.pytorch import PyTorchModel
        from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism

        peer = self

        class Cohort(FederatedDatasetBase):
            """The round's exported cohort, in order (fedpriv's sampler chose it)."""

            users: list = []

            def __next__(self):
                raise StopIteration

            def get_cohort(self, cohort_size):
                for u in self.users:
                    yield peer.user_dataset(int(u)), int(u)

        module = self.NWP()
        params = [p for p in module.parameters() if p.requires_grad]
        model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD, central_optimizer=torch.optim.SGD(params, lr=1.0))
        if variant == "fedavg":
            post = [WeightByDatapoints()]
        else:
            S = self.S if clip is None else clip
            zz = (self.z if variant == "dp-fedavg" else 0.0) if z is None else z
            post = [WeightByUser(), CentrallyAppliedPrivacyMechanism(GaussianMechanism(S, zz))]
        data = Cohort()
        backend = SimulatedBackend(training_data=data, val_data=data, postprocessors=post)
        return model, FederatedAveraging(), backend, data

    def one_round(self, model, algo, backend, data, r: int, m: int):
        from pfl.algorithm import NNAlgorithmParams
        from pfl.context import CentralContext
        from pfl.common_types import Population
        from pfl.hyperparam import NNTrainHyperParams

        data.users = list(self.cohorts[r]) if m is None else list(self.cohorts[r][:m])
        n = len(data.users)
        ctx = CentralContext(current_central_iteration=r, do_evaluation=False, cohort_size=n, population=Population.TRAIN,
                             algorithm_params=NNAlgorithmParams(central_num_iterations=10**6, evaluation_frequency=10**9, train_cohort_size=n, val_cohort_size=None),
                             model_train_params=NNTrainHyperParams(local_num_epochs=1, local_learning_rate=self.lr, local_batch_size=self.B), seed=r)
        stats, metrics = backend.gather_results(model, algo, central_context=ctx)
        model, _ = algo.process_aggregated_statistics(ctx, metrics, model, stats)
        return model, metrics

    def export(self, model, out: str) -> None:
        np = self.np
        m = model.pytorch_model
        a = lambda t: t.detach().numpy().astype(np.float32)  # noqa: E731
        arrays = {"embed": a(m.embed.weight), "lstm_wi": a(m.lstm.weight_ih_l0).T, "lstm_wh": a(m.lstm.weight_hh_l0).T,
                  "lstm_b": a(m.lstm.bias_ih_l0) + a(m.lstm.bias_hh_l0), "projection_kernel": a(m.projection.weight).T,
                  "projection_bias": a(m.projection.bias), "output_kernel": a(m.output.weight).T, "output_bias": a(m.output.bias)}
        np.savez(out, **arrays)

    def equiv(self, cmd: dict) -> dict:
        model, algo, backend, data = self.build(cmd["strategy"], cmd.get("clip"), cmd.get("z"))
        model, metrics = self.one_round(model, algo, backend, data, 1, None)
        self.export(model, cmd["out"])
        return {"users": len(self.cohorts[1])}

    def rounds(self, cmd: dict) -> dict:
        model, algo, backend, data = self.build(cmd["variant"])
        ok = reset_peak()
        times = []
        for r in cmd["rounds"]:
            t = time.perf_counter()
            model, _ = self.one_round(model, algo, backend, data, int(r), None)
            times.append(time.perf_counter() - t)
        return {"times": times, "peak_mb": proc_status("VmHWM") if ok else None, "rss_mb": proc_status("VmRSS")}

    def epsilon(self, cmd: dict) -> dict:
        from pfl.privacy import PLDPrivacyAccountant, PRVPrivacyAccountant, RDPPrivacyAccountant

        out = []
        for c in cmd["configs"]:
            row = {}
            for name, cls in (("rdp", RDPPrivacyAccountant), ("pld", PLDPrivacyAccountant), ("prv", PRVPrivacyAccountant)):
                try:
                    acc = cls(num_compositions=int(c["steps"]), sampling_probability=float(c["q"]), mechanism="gaussian",
                              noise_parameter=float(c["sigma"]), delta=float(c["delta"]))
                    row[name] = float(acc.epsilon)
                except Exception as e:  # noqa: BLE001  reported on the page
                    row[name + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            out.append(row)
        return {"results": out}


def main() -> None:
    import torch
    from importlib.metadata import version

    if "--threads" in sys.argv:  # torch's intra-op threads (default: torch's own, the number of cores)
        torch.set_num_threads(int(sys.argv[sys.argv.index("--threads") + 1]))
    peer = PflPeer(sys.argv[1])
    print(json.dumps({"ok": True, "pfl": version("pfl"), "torch": torch.__version__, "dp_accounting": version("dp-accounting"),
                      "prv_accountant": version("prv-accountant"), "threads": torch.get_num_threads(), "rss_mb": proc_status("VmRSS")}), flush=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from protocol import serve  # benchmarks/peers/protocol.py, next to this script

    serve(peer, handlers={"equiv": peer.equiv, "rounds": peer.rounds, "epsilon": peer.epsilon})


if __name__ == "__main__":
    main()
