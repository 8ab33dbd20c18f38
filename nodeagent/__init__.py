"""The GPU node agent: runs on every GPU server, pulls the desired state of its node from
the storefront, converges containers and disks to it and reports what it sees. Plain
Python, no Django (see PROTOCOL.md)."""
__version__ = "0.1.0"
