"""TensorFlow Privacy's side (runs in .bench-envs/tf: tensorflow 2.14 + tensorflow-privacy 0.9.0).

    .bench-envs/tf/bin/python benchmarks/peers/tf_peer.py epsilon < configs.json
    .bench-envs/tf/bin/python benchmarks/peers/tf_peer.py nwp X.npz

``nwp``: a line-oriented server like opacus_peer.py (one JSON command per stdin line, one JSON
answer per stdout line) for the NWP LSTM exported by fedpriv_side.export_nwp, as a Keras model
(Embedding -> LSTM -> Dense -> Dense; Keras' LSTM has one gate bias and fedpriv's gate order i, f,
g, o, so the weights load as they are). ``{"cmd": "equiv", "k": K, "lr": LR}``: K noise-free steps of
``DPKerasSGDOptimizer`` (clip C = 1, noise 0, one microbatch per example); answers the mean loss
before each step and after the last. ``{"cmd": "time", "variant": V, "n": N}``: ``non-private``
(Keras Adam) or ``dp-keras`` (``DPKerasAdamOptimizer``, clip 1, noise 1, microbatches = batch);
each step one ``tf.function`` (as ``model.fit`` would run it).

``epsilon``: reads a JSON list of {n, batch, sigma, epochs, delta} and answers, for each, the
epsilon and optimal RDP order of ``compute_dp_sgd_privacy_lib.compute_dp_sgd_privacy`` (Poisson
sampling q = batch/n, ceil(epochs * n / batch) steps, add-or-remove-one example, RDP). A config
with ``orders`` (a list) also gets ``epsilon_on_orders``/``order_on_orders``: the same event through
this environment's dp-accounting RdpAccountant on those orders (the driver passes fedpriv's grid,
which separates the effect of the order grid from that of the dp-accounting version).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
warnings.filterwarnings("ignore")


C, SIGMA, ADAM_LR = 1.0, 1.0, 1e-3


class NWPPeer:
    def __init__(self, path: str):
        import numpy as np
        import tensorflow as tf

        self.tf = tf
        w = dict(np.load(path))
        self.w = w
        ids = tf.constant(w["ids"], tf.int32)
        self.x, self.y = ids[:, :-1], ids[:, 1:]
        self.B = int(w["ids"].shape[0])
        self.ready: dict = {}
        self.first_call: dict = {}  # variant -> seconds of its first call (trace + compile + one step)

    def build(self):
        tf = self.tf
        w = self.w
        V, E = w["embed"].shape
        H, P = w["lstm_wh"].shape[0], w["projection_kernel"].shape[1]
        model = tf.keras.Sequential([tf.keras.layers.Embedding(V, E), tf.keras.layers.LSTM(H, return_sequences=True),
                                     tf.keras.layers.Dense(P), tf.keras.layers.Dense(V)])
        model.build((None, self.x.shape[1]))
        model.set_weights([w["embed"], w["lstm_wi"], w["lstm_wh"], w["lstm_b"], w["projection_kernel"], w["projection_bias"],
                           w["output_kernel"], w["output_bias"]])
        return model

    def per_example(self, logits):
        """(B,) mean cross-entropy over each example's non-pad (id != 0) targets, as fedpriv's NWPTask."""
        tf = self.tf
        nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=self.y, logits=logits)
        valid = tf.cast(self.y != 0, tf.float32)
        return tf.reduce_sum(nll * valid, 1) / tf.maximum(tf.reduce_sum(valid, 1), 1.0)

    def make(self, variant: str, opt=None):
        tf = self.tf
        from tensorflow_privacy import DPKerasAdamOptimizer

        model = self.build()
        if variant == "non-private":
            opt = opt or tf.keras.optimizers.Adam(ADAM_LR)

            @tf.function
            def step():
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(self.per_example(model(self.x, training=True)))
                opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
                return loss

            return model, step
        opt = opt or DPKerasAdamOptimizer(l2_norm_clip=C, noise_multiplier=SIGMA, num_microbatches=self.B, learning_rate=ADAM_LR)
        box = {}

        @tf.function
        def step():
            # TF Privacy's own path for a custom loop (what its Keras optimizers run under model.fit): the per-example
            # (microbatch) losses go to _compute_gradients, which takes their jacobian, clips each row, sums, noises, divides.
            gv = opt._compute_gradients(lambda: box.__setitem__("l", self.per_example(model(self.x, training=True))) or box["l"],
                                        model.trainable_variables, tape=tf.GradientTape())
            opt.apply_gradients(gv)
            return tf.reduce_mean(box["l"])

        return model, step

    def equiv(self, k: int, lr: float) -> list[float]:
        from tensorflow_privacy import DPKerasSGDOptimizer

        opt = DPKerasSGDOptimizer(l2_norm_clip=C, noise_multiplier=0.0, num_microbatches=self.B, learning_rate=lr)
        model, step = self.make("dp-keras", opt)
        losses = [float(step()) for _ in range(k)]
        losses.append(float(self.tf.reduce_mean(self.per_example(model(self.x, training=False)))))
        return losses

    def time(self, variant: str, n: int) -> list[float]:
        import time

        if variant not in self.ready:
            _, step = self.make(variant)
            t = time.perf_counter()
            step()  # trace, compile, warm up (one call: the jacobian-based DP step takes minutes to trace and about a minute to run)
            self.first_call[variant] = time.perf_counter() - t
            print(f"[tf_peer] {variant}: first call (trace + compile + one step) {self.first_call[variant]:.1f} s", file=sys.stderr, flush=True)
            self.ready[variant] = step
        step, out = self.ready[variant], []
        for _ in range(n):
            t = time.perf_counter()
            float(step())
            out.append(time.perf_counter() - t)
        return out


def serve_nwp(path: str) -> None:
    import tensorflow as tf
    import tensorflow_privacy

    peer = NWPPeer(path)
    print(json.dumps({"ok": True, "tensorflow": tf.__version__, "tensorflow_privacy": tensorflow_privacy.__version__,
                      "threads": [tf.config.threading.get_intra_op_parallelism_threads(), tf.config.threading.get_inter_op_parallelism_threads()]}), flush=True)
    from protocol import serve  # benchmarks/peers/protocol.py, next to this script

    serve(peer, equiv_variant=False)


def main() -> None:
    import tensorflow as tf
    import tensorflow_privacy
    from tensorflow_privacy.privacy.analysis import compute_dp_sgd_privacy_lib as lib

    if sys.argv[1] == "nwp":
        return serve_nwp(sys.argv[2])
    if sys.argv[1] != "epsilon":
        raise SystemExit(f"unknown command {sys.argv[1]}")
    out = []
    for c in json.load(sys.stdin):
        eps, order = lib.compute_dp_sgd_privacy(c["n"], c["batch"], c["sigma"], c["epochs"], c["delta"])
        row = {"epsilon": float(eps), "order": float(order)}
        if c.get("orders"):
            import math

            import dp_accounting

            acc = dp_accounting.rdp.RdpAccountant(list(c["orders"]))
            q = c["batch"] / c["n"]
            acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(c["sigma"])), int(math.ceil(c["epochs"] * c["n"] / c["batch"])))
            e2, o2 = acc.get_epsilon_and_optimal_order(c["delta"])
            row.update(epsilon_on_orders=float(e2), order_on_orders=float(o2))
        out.append(row)
    from importlib.metadata import version

    print(json.dumps({"tensorflow": tf.__version__, "tensorflow_privacy": tensorflow_privacy.__version__, "dp_accounting": version("dp-accounting"), "results": out}))


if __name__ == "__main__":
    main()
