"""Central training over records: the batch order (:mod:`.order`), plain SGD (:mod:`.sgd`), DP-SGD
with time-spread large batches (:mod:`.dpsgd`), and the entry points (:mod:`.train`)."""
