"""Primus-Turbo: training operators for NVIDIA Hopper with a framework-free C++ core.

Import the PyTorch API as ``import primus_turbo.pytorch as turbo``.
"""

__version__ = "0.1.0"
