"""gpu-rent: a command-line client over the storefront's public API (/api/v1)."""
__version__ = "0.1.0"
