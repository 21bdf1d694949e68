"""TensorFlow Federated's side (runs in .bench-envs/tff: tensorflow-federated 0.87.0, TF 2.14).

    .bench-envs/tff/bin/python benchmarks/peers/tff_peer.py X.npz

A line-oriented server (benchmarks/peers/protocol.py) for DP-FedAvg on the NWP task exported by
run.py's ``tff`` section: the initial weights of fedpriv's NWP model (fedpriv_side.export_nwp's
layout) and each user's examples (``user<i>``: (n_i, L + 1) ids, in the order of fedpriv's round-1
plan, so that batches of B cut in order are fedpriv's round-1 batches). The algorithm is
``tff.learning.algorithms.build_unweighted_fed_avg`` with

* the Keras port of the NWP LSTM (Embedding -> LSTM -> Dense -> Dense, as tf_peer.py; Keras' LSTM
  has fedpriv's single gate bias and gate order), loss per example the mean cross-entropy over its
  non-pad targets, per batch the mean over the batch's examples (fedpriv's NWPTask);
* client optimizer SGD (learning rate ``client_lr``), one local epoch, batches of B in order;
* server optimizer SGD 1.0 (the averaged delta applied as it is, as fedpriv's default);
* ``model_aggregator = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(noise_multiplier=z,
  clients_per_round=m, clip=S)``: each client's delta clipped to L2 norm S, summed, N(0, (zS)^2)
  per coordinate added to the sum, divided by m.

Commands: ``{"cmd": "equiv", "k": 1, "lr": 0, "out": PATH[, "z": Z, "clip": S]}`` (``lr`` unused): k
rounds with noise multiplier Z (default 0) and clip S (default the exported one) from the exported weights; the new weights go to PATH (.npz, export
layout); answers the last round's mean client training loss. ``{"cmd": "time",
"variant": "dp-fedavg", "n": R}``: R rounds with the run's z, from the exported weights (a fresh
state), every client every round; answers the wall seconds of each ``process.next``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
warnings.filterwarnings("ignore")

NAMES = ["embed", "lstm_wi", "lstm_wh", "lstm_b", "projection_kernel", "projection_bias", "output_kernel", "output_bias"]


class TFFPeer:
    def __init__(self, path: str):
        import numpy as np
        import tensorflow as tf
        import tensorflow_federated as tff

        self.tf, self.tff, self.np = tf, tff, np
        w = dict(np.load(path))
        self.w = w
        self.z, self.S, self.B, self.lr = float(w["z"]), float(w["clip"]), int(w["batch"]), float(w["client_lr"])
        users = sorted((k for k in w if k.startswith("user")), key=lambda k: int(k[4:]))
        self.m = len(users)
        self.L = int(w[users[0]].shape[1]) - 1

        def ds(ids):
            ids = ids.astype(np.int32)
            return tf.data.Dataset.from_tensor_slices((ids[:, :-1], ids[:, 1:])).batch(self.B)

        self.client_data = [ds(w[u]) for u in users]
        self.processes: dict = {}

    def keras_model(self):
        tf, w = self.tf, self.w
        V, E = w["embed"].shape
        H, P = w["lstm_wh"].shape[0], w["projection_kernel"].shape[1]
        model = tf.keras.Sequential([tf.keras.layers.Embedding(V, E), tf.keras.layers.LSTM(H, return_sequences=True),
                                     tf.keras.layers.Dense(P), tf.keras.layers.Dense(V)])
        model.build((None, self.L))
        return model

    def process(self, z: float, clip: float | None = None):
        clip = self.S if clip is None else clip
        if (z, clip) in self.processes:
            return self.processes[(z, clip)]
        tf, tff = self.tf, self.tff
        L = self.L

        class NWPLoss(tf.keras.losses.Loss):
            """Per example: mean cross-entropy over its non-pad (id != 0) targets; Keras then averages over the batch."""

            def call(self, y_true, y_pred):
                y_true = tf.cast(y_true, tf.int32)
                nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_true, logits=y_pred)
                valid = tf.cast(tf.not_equal(y_true, 0), tf.float32)  # not `!=`: TFF traces in graph mode, where it is identity
                return tf.reduce_sum(nll * valid, 1) / tf.maximum(tf.reduce_sum(valid, 1), 1.0)

        spec = (tf.TensorSpec([None, L], tf.int32), tf.TensorSpec([None, L], tf.int32))

        def model_fn():
            return tff.learning.models.from_keras_model(self.keras_model(), loss=NWPLoss(), input_spec=spec)

        agg = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(noise_multiplier=z, clients_per_round=self.m, clip=clip)
        proc = tff.learning.algorithms.build_unweighted_fed_avg(
            model_fn,
            client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=self.lr),
            server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
            model_aggregator=agg,
        )
        self.processes[(z, clip)] = proc
        return proc

    def fresh_state(self, proc):
        state = proc.initialize()
        weights = self.tff.learning.models.ModelWeights(trainable=[self.w[k] for k in NAMES], non_trainable=[])
        return proc.set_model_weights(state, weights)

    def equiv(self, k: int, lr: float, out: str, z: float = 0.0, clip: float | None = None) -> list[float]:
        proc = self.process(z, clip)
        state = self.fresh_state(proc)
        for _ in range(k):
            result = proc.next(state, self.client_data)
            state = result.state
        trained = proc.get_model_weights(state).trainable
        self.np.savez(out, **{name: self.np.asarray(a, self.np.float32) for name, a in zip(NAMES, trained)})
        return [float(result.metrics["client_work"]["train"]["loss"])]

    def time(self, variant: str, n: int) -> list[float]:
        import time

        proc = self.process(self.z)
        state = self.fresh_state(proc)
        out = []
        for _ in range(n):
            t = time.perf_counter()
            state = proc.next(state, self.client_data).state
            out.append(time.perf_counter() - t)
        return out


def main() -> None:
    import tensorflow as tf
    import tensorflow_federated as tff
    import tensorflow_privacy
    from importlib.metadata import version

    peer = TFFPeer(sys.argv[1])
    print(json.dumps({"ok": True, "tensorflow_federated": tff.__version__, "tensorflow": tf.__version__,
                      "tensorflow_privacy": tensorflow_privacy.__version__, "jax": version("jax"), "jaxlib": version("jaxlib"),
                      "clients": peer.m}), flush=True)
    from protocol import serve  # benchmarks/peers/protocol.py, next to this script

    serve(peer, equiv=lambda cmd: peer.equiv(cmd["k"], cmd.get("lr", 0.0), cmd["out"], cmd.get("z", 0.0), cmd.get("clip")))


if __name__ == "__main__":
    main()
