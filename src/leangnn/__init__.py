"""leangnn: train graph neural networks that are too deep or too large for memory."""

__version__ = "0.1.0"
