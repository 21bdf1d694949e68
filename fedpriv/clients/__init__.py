"""The client side of federated training: a user's local data plan and the local SGD update."""
