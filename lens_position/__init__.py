"""lens_position: where absolute position comes from in decoder-only transformers."""

__version__ = "0.1.0"
