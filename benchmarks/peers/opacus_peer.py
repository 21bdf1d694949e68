"""Opacus' side (runs in .bench-envs/opacus: torch CPU build + opacus; needs NumPy only from us).

    .bench-envs/opacus/bin/python benchmarks/peers/opacus_peer.py --model nwp|bert --data X.npz

A line-oriented server, so that the driver can interleave it with fedpriv's steps: one JSON
command per stdin line, one JSON answer per stdout line.

* ``{"cmd": "equiv", "k": K, "lr": LR}``: from the exported weights, K noise-free DP-SGD steps
  (per-example clip C = 1, noise 0, plain SGD) through Opacus' GradSampleModule + DPOptimizer on
  the exported batch; answers the mean loss before each step and after the last.
* ``{"cmd": "time", "variant": V, "n": N}``: N steps of variant V (``non-private``: plain torch +
  Adam; ``dp-hooks``: Opacus' per-sample gradients from hooks (the default grad_sample_mode);
  ``dp-ghost``: Opacus' fast gradient clipping (grad_sample_mode "ghost")), each DP step
  clip C = 1, noise multiplier 1, Adam lr 1e-3; answers the seconds of each step.
* ``{"cmd": "quit"}``.

The NWP model uses Opacus' DPLSTM (an nn.LSTM that Opacus can compute per-sample gradients
for); the non-private baseline uses torch's nn.LSTM (fused kernels), as a user would.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

C, SIGMA, ADAM_LR = 1.0, 1.0, 1e-3


# ---- models -------------------------------------------------------------------------------------
class NWP(nn.Module):
    def __init__(self, w: dict, dp_lstm: bool):
        super().__init__()
        V, E = w["embed"].shape
        H = w["lstm_wh"].shape[0]
        P = w["projection_kernel"].shape[1]
        self.embed = nn.Embedding(V, E)
        if dp_lstm:
            from opacus.layers import DPLSTM

            self.lstm = DPLSTM(E, H, batch_first=True)
        else:
            self.lstm = nn.LSTM(E, H, batch_first=True)
        self.projection = nn.Linear(H, P)
        self.output = nn.Linear(P, V)
        t = lambda a: torch.tensor(np.asarray(a, np.float32))  # noqa: E731
        sd = {
            "embed.weight": t(w["embed"]),
            "lstm.weight_ih_l0": t(w["lstm_wi"].T), "lstm.weight_hh_l0": t(w["lstm_wh"].T),
            "lstm.bias_ih_l0": t(w["lstm_b"]), "lstm.bias_hh_l0": torch.zeros(4 * H),
            "projection.weight": t(w["projection_kernel"].T), "projection.bias": t(w["projection_bias"]),
            "output.weight": t(w["output_kernel"].T), "output.bias": t(w["output_bias"]),
        }
        lstm = {k[5:]: sd.pop(k) for k in list(sd) if k.startswith("lstm.")}
        missing, unexpected = self.load_state_dict(sd, strict=False)
        assert not unexpected and all(m.startswith("lstm.") for m in missing), (missing, unexpected)
        with torch.no_grad():  # nn.LSTM names weight_ih_l0..., DPLSTM l0.ih.weight...
            for name, prm in self.lstm.named_parameters():
                kind = ("weight" if "weight" in name else "bias") + ("_ih" if "ih" in name else "_hh")
                prm.copy_(lstm[kind + "_l0"])
                if kind == "bias_hh":  # fedpriv (like Keras) has ONE gate bias; torch's second one stays 0, untrained
                    prm.requires_grad_(False)

    def forward(self, ids):
        h, _ = self.lstm(self.embed(ids))
        return self.output(self.projection(h))


def nwp_per_example_loss(logits, targets):
    """(B,) mean cross-entropy over each example's non-pad (id != 0) targets, as fedpriv's NWPTask."""
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none").reshape(targets.shape)
    valid = (targets != 0).float()
    return (nll * valid).sum(1) / valid.sum(1).clamp(min=1.0)


class Block(nn.Module):
    def __init__(self, h, heads, inter, p):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value, self.out = (nn.Linear(h, h) for _ in range(4))
        self.attention_norm = nn.LayerNorm(h, eps=1e-12)
        self.ffn_in, self.ffn_out = nn.Linear(h, inter), nn.Linear(inter, h)
        self.ffn_norm = nn.LayerNorm(h, eps=1e-12)
        self.drop = nn.Dropout(p)

    def forward(self, x, valid):
        b, l, h = x.shape
        dh = h // self.heads
        split = lambda y: y.view(b, l, self.heads, dh).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        logits = q @ k.transpose(-1, -2) / math.sqrt(dh)
        logits = logits.masked_fill(~valid[:, None, None, :], torch.finfo(logits.dtype).min)
        wts = self.drop(torch.softmax(logits, -1))
        a = self.out((wts @ v).transpose(1, 2).reshape(b, l, h))
        x = self.attention_norm(x + self.drop(a))
        f = self.ffn_out(F.gelu(self.ffn_in(x)))
        return self.ffn_norm(x + self.drop(f))


class BertMLM(nn.Module):
    """fedpriv's BertMLM (post-LN, no token types, untied output layer), in torch."""

    def __init__(self, w: dict, cfg, p: float):
        super().__init__()
        V, H, layers, heads, inter, max_len = (int(x) for x in cfg)
        self.token_embed, self.position_embed = nn.Embedding(V, H), nn.Embedding(max_len, H)
        self.embed_norm = nn.LayerNorm(H, eps=1e-12)
        self.drop = nn.Dropout(p)
        self.layers = nn.ModuleList(Block(H, heads, inter, p) for _ in range(layers))
        self.mlm_dense, self.mlm_norm, self.mlm_output = nn.Linear(H, H), nn.LayerNorm(H, eps=1e-12), nn.Linear(H, V)
        t = lambda a: torch.tensor(np.asarray(a, np.float32))  # noqa: E731
        g = lambda k: w["param:" + k]  # noqa: E731
        sd = {}

        def dense(dst, src):
            sd[dst + ".weight"], sd[dst + ".bias"] = t(g(src + "/kernel").T), t(g(src + "/bias"))

        def norm(dst, src):
            sd[dst + ".weight"], sd[dst + ".bias"] = t(g(src + "/scale")), t(g(src + "/bias"))

        sd["token_embed.weight"] = t(g("encoder/token_embed/embedding"))
        sd["position_embed.weight"] = t(g("encoder/position_embed/embedding"))
        norm("embed_norm", "encoder/embed_norm")
        for i in range(layers):
            for n in ("query", "key", "value", "out"):
                dense(f"layers.{i}.{n}", f"encoder/layer_{i}/attention/{n}")
            norm(f"layers.{i}.attention_norm", f"encoder/layer_{i}/attention_norm")
            dense(f"layers.{i}.ffn_in", f"encoder/layer_{i}/ffn_in")
            dense(f"layers.{i}.ffn_out", f"encoder/layer_{i}/ffn_out")
            norm(f"layers.{i}.ffn_norm", f"encoder/layer_{i}/ffn_norm")
        dense("mlm_dense", "mlm_dense")
        norm("mlm_norm", "mlm_norm")
        dense("mlm_output", "mlm_output")
        self.load_state_dict(sd)

    def forward(self, inputs, length, positions):
        b, l = inputs.shape
        pos = torch.arange(l).expand(b, l).contiguous()  # see Peer.__init__: Opacus' ghost embedding norm needs contiguous ids
        x = self.drop(self.embed_norm(self.token_embed(inputs) + self.position_embed(pos)))
        valid = torch.arange(l)[None, :] < length[:, None]
        for layer in self.layers:
            x = layer(x, valid)
        h = torch.gather(x, 1, positions[..., None].expand(-1, -1, x.shape[-1]))
        return self.mlm_output(self.mlm_norm(F.gelu(self.mlm_dense(h))))


def bert_per_example_loss(logits, targets, weights):
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none").reshape(targets.shape)
    return (nll * weights).sum(1) / weights.sum(1).clamp(min=1.0)


# ---- steps --------------------------------------------------------------------------------------
class Peer:
    def __init__(self, model: str, path: str):
        self.kind = model
        self.w = dict(np.load(path))
        if model == "nwp":
            ids = torch.tensor(self.w["ids"])
            # contiguous: Opacus' ghost norm for nn.Embedding calls input_ids.view(-1, 1), which fails on a sliced tensor
            self.inputs, self.targets = (ids[:, :-1].contiguous(),), ids[:, 1:].contiguous()
        else:
            d = {k: torch.tensor(self.w[k]) for k in ("inputs", "length", "positions", "targets", "weights")}
            self.inputs, self.targets = (d["inputs"], d["length"], d["positions"]), (d["targets"], d["weights"])
        self.B = int(self.inputs[0].shape[0])
        self.ready: dict = {}

    def build(self, dp: bool, dropout: float = 0.1) -> nn.Module:
        if self.kind == "nwp":
            return NWP(self.w, dp_lstm=dp)
        return BertMLM(self.w, self.w["cfg"], dropout)

    def per_example(self, out):
        if self.kind == "nwp":
            return nwp_per_example_loss(out, self.targets)
        return bert_per_example_loss(out, *self.targets)

    def make(self, variant: str, dropout: float = 0.1, opt_factory=None, sigma: float = SIGMA):
        """(model, step) for one variant; step() runs one training step and returns the loss."""
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        opt_factory = opt_factory or (lambda ps: torch.optim.Adam(ps, lr=ADAM_LR))
        model = self.build(dp=variant != "non-private", dropout=dropout)
        model.train()
        if variant == "non-private":
            opt = opt_factory(model.parameters())

            def step():
                opt.zero_grad(set_to_none=True)
                loss = self.per_example(model(*self.inputs)).mean()
                loss.backward()
                opt.step()
                return float(loss.detach())

            return model, step
        if variant == "dp-hooks":
            gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean")
            opt = DPOptimizer(opt_factory(gsm.parameters()), noise_multiplier=sigma, max_grad_norm=C, expected_batch_size=self.B, loss_reduction="mean")

            def step():
                opt.zero_grad(set_to_none=True)
                loss = self.per_example(gsm(*self.inputs)).mean()
                loss.backward()
                opt.step()
                return float(loss.detach())

            return gsm, step
        if variant == "dp-ghost":
            from opacus.grad_sample import GradSampleModuleFastGradientClipping
            from opacus.optimizers import DPOptimizerFastGradientClipping

            gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="mean", max_grad_norm=C, use_ghost_clipping=True)
            opt = DPOptimizerFastGradientClipping(opt_factory(gsm.parameters()), noise_multiplier=sigma, max_grad_norm=C, expected_batch_size=self.B, loss_reduction="mean")

            def step():
                # Opacus' two-pass ghost clipping (what DPLossFastGradientClipping does): the first
                # backward computes per-sample norms, the second the clipped-gradient sum.
                opt.zero_grad(set_to_none=True)
                per = self.per_example(gsm(*self.inputs))
                gsm.enable_hooks()
                per.mean().backward(retain_graph=True)
                coeff = gsm.get_clipping_coef()
                gsm.disable_hooks()
                opt.zero_grad(set_to_none=True)
                (per * coeff).sum().backward()
                gsm.enable_hooks()
                opt.step()
                return float(per.detach().mean())

            return gsm, step
        raise ValueError(variant)

    def equiv(self, k: int, lr: float, variant: str = "dp-hooks") -> list[float]:
        """Mean loss before each of k noise-free DP steps (clip C, plain SGD) and after the last."""
        model, step = self.make(variant, dropout=0.0, opt_factory=lambda ps: torch.optim.SGD(ps, lr=lr), sigma=0.0)
        losses = [step() for _ in range(k)]
        with torch.no_grad():
            losses.append(float(self.per_example(model(*self.inputs)).mean()))
        return losses

    def time(self, variant: str, n: int) -> list[float]:
        if variant not in self.ready:
            _, step = self.make(variant)
            step()
            step()  # warm up
            self.ready[variant] = step
        step, out = self.ready[variant], []
        for _ in range(n):
            t = time.perf_counter()
            step()
            out.append(time.perf_counter() - t)
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["nwp", "bert", "epsilon"], required=True)
    ap.add_argument("--data")
    args = ap.parse_args()
    import opacus

    if args.model == "epsilon":  # Opacus' RDP accountant: JSON list of {q, sigma, steps, delta} on stdin
        from opacus.accountants import RDPAccountant

        out = []
        for c in json.load(sys.stdin):
            acc = RDPAccountant()
            acc.history = [(c["sigma"], c["q"], c["steps"])]
            eps, order = acc.get_privacy_spent(delta=c["delta"])
            out.append({"epsilon": float(eps), "order": float(order)})
        print(json.dumps({"opacus": opacus.__version__, "results": out}))
        return

    peer = Peer(args.model, args.data)
    print(json.dumps({"ok": True, "torch": torch.__version__, "opacus": opacus.__version__, "threads": torch.get_num_threads()}), flush=True)
    from protocol import serve  # benchmarks/peers/protocol.py, next to this script

    serve(peer)


if __name__ == "__main__":
    main()
