"""MindFoundry: pretraining of decoder-only LLMs on MindSpore, with a PyTorch baseline."""

__version__ = "0.1.0"
