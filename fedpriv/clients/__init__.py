"""The client side of federated training: a user's local data plan (:mod:`.data`), the local SGD
update with optional client-side DP-SGD (:mod:`.update`), and its record-level accounting
(:mod:`.privacy`)."""
