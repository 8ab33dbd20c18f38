"""Instance runtimes (nodeagent.interfaces.Runtime). Only Docker ships: a VM runtime
(QEMU/KVM + VFIO) can be added beside it, see ../README.md."""
