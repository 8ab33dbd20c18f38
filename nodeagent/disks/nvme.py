"""NVMe sanitize capabilities (`nvme id-ctrl -o json`) and the choice of wipe method.

Identify Controller fields used (NVMe Base Specification 2.0):
- `sanicap` bit 0 crypto erase, bit 1 block erase, bit 2 overwrite (Sanitize command).
- `fna` bit 0 a Format NVM applies to all namespaces, bit 1 its secure erase applies to
  all namespaces, bit 2 cryptographic erase is supported as part of a format (SES=2).
- `oacs` bit 1 Format NVM supported; `mn`/`sn`/`fr` model, serial, firmware.

A plain format (SES=0) erases nothing and is never chosen."""
import json
from dataclasses import dataclass

SANICAP_CRYPTO, SANICAP_BLOCK, SANICAP_OVERWRITE = 1 << 0, 1 << 1, 1 << 2
FNA_FORMAT_ALL_NS, FNA_SECURE_ERASE_ALL_NS, FNA_CRYPTO_FORMAT = 1 << 0, 1 << 1, 1 << 2
OACS_FORMAT = 1 << 1

# How much of the drive the lease's device is (the carver decides, the operator configures):
SCOPE_DRIVE = "drive"            # the whole drive (every namespace) belongs to this lease
SCOPE_NAMESPACE = "namespace"    # one NVMe namespace; other namespaces may hold other data
SCOPE_SHARED = "shared"          # an LV or a partition: neighbours on the same namespace



@dataclass(frozen=True)
class NvmeCapabilities:
    model: str
    serial: str
    firmware: str
    sanicap: int
    fna: int
    oacs: int

    @classmethod
    def from_id_ctrl(cls, text: str) -> "NvmeCapabilities":
        doc = json.loads(text)
        return cls(model=str(doc.get("mn", "")).strip(), serial=str(doc.get("sn", "")).strip(),
                   firmware=str(doc.get("fr", "")).strip(), sanicap=int(doc.get("sanicap", 0)),
                   fna=int(doc.get("fna", 0)), oacs=int(doc.get("oacs", 0)))

    @property
    def sanitize_crypto(self) -> bool:
        return bool(self.sanicap & SANICAP_CRYPTO)

    @property
    def sanitize_block(self) -> bool:
        return bool(self.sanicap & SANICAP_BLOCK)

    @property
    def sanitize_overwrite(self) -> bool:
        return bool(self.sanicap & SANICAP_OVERWRITE)

    @property
    def format_supported(self) -> bool:
        return bool(self.oacs & OACS_FORMAT)

    @property
    def format_crypto(self) -> bool:
        return bool(self.fna & FNA_CRYPTO_FORMAT)

    @property
    def format_hits_all_namespaces(self) -> bool:
        return bool(self.fna & (FNA_FORMAT_ALL_NS | FNA_SECURE_ERASE_ALL_NS))


def choose_method(caps: NvmeCapabilities | None, scope: str) -> str:
    """The strongest method that touches only this lease's blocks.

    Sanitize acts on the whole NVM subsystem, so only a lease owning the drive may use it;
    a format may act on every namespace (fna bits 0/1), so a lease owning one namespace
    may format only when it does not. LVs and partitions share a namespace: discard plus
    a zero overwrite of their own range (see docs/DISKS.md for why that is Purge here)."""
    if caps is not None and scope == SCOPE_DRIVE:
        if caps.sanitize_crypto:
            return "sanitize-crypto"
        if caps.sanitize_block:
            return "sanitize-block"
    format_allowed = caps is not None and caps.format_supported and (
        scope == SCOPE_DRIVE or (scope == SCOPE_NAMESPACE and not caps.format_hits_all_namespaces))
    if format_allowed:
        return "format-ses2" if caps.format_crypto else "format-ses1"
    return "discard+overwrite"


def sanitize_status(log_text: str) -> tuple[int, int]:
    """(status, progress/65536) from `nvme sanitize-log -o json`. nvme-cli nests the log
    under the device name and prints `sstat` as a number or as an object with `status`."""
    doc = json.loads(log_text)
    if "sstat" not in doc and len(doc) == 1:
        doc = next(iter(doc.values()))
    sstat = doc.get("sstat", 0)
    status = int(sstat.get("status", 0)) if isinstance(sstat, dict) else int(sstat) & 0x7
    return status, int(doc.get("sprog", 0))


SANITIZE_DONE, SANITIZE_RUNNING, SANITIZE_FAILED, SANITIZE_DONE_NO_DEALLOC = 1, 2, 3, 4
