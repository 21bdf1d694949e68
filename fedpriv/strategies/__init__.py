"""Federated strategies: the shared server math (core) and Flower Strategy subclasses (flower)."""
