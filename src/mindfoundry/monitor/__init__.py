"""Watching a run: health rules, model FLOPs utilisation, TensorBoard event files (framework-free)."""
