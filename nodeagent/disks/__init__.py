"""Encrypted per-lease disks for the node agent: LUKS2 on a carved device, key
destruction with proof, and NIST SP 800-88 sanitization with read-back verification.
See docs/DISKS.md."""
from .backend import LuksDisks
from .carvers import DevicePoolCarver, LvmCarver
from .config import disks_from_config
from .keystore import KeyStore
from .runner import Runner
from .state import StateDir

__all__ = ["LuksDisks", "LvmCarver", "DevicePoolCarver", "KeyStore", "Runner", "StateDir",
           "disks_from_config"]
