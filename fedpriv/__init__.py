"""fedpriv: measure and reduce what language models memorize about the people in their training data."""

__version__ = "0.1.0"
