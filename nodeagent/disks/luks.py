"""LUKS2 on a block device through cryptsetup. Keys travel only on stdin
(`--key-file -`); argv and the recorded evidence never contain them."""
import json
import os

from nodeagent.interfaces import OperationFailed

from .runner import Runner

# The key is 512 bits from os.urandom: key stretching protects low-entropy passphrases and
# would only cost time and (argon2id) a GiB of RAM per open, so PBKDF2 at its minimum.
FORMAT_OPTIONS = ["--type", "luks2", "--batch-mode", "--cipher", "aes-xts-plain64",
                  "--key-size", "512", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]


def is_luks(runner: Runner, device: str) -> bool:
    return runner.run(["cryptsetup", "isLuks", device], check=False).exit == 0


def luks_format(runner: Runner, device: str, key: bytes, label: str) -> str:
    """Format `device` as LUKS2 with `key`; returns the LUKS UUID."""
    runner.run(["cryptsetup", "luksFormat", *FORMAT_OPTIONS, "--label", label,
                "--key-file", "-", device], secret_stdin=bytes(key))
    return luks_uuid(runner, device)


def luks_uuid(runner: Runner, device: str) -> str:
    return runner.run(["cryptsetup", "luksUUID", device]).stdout.strip()


def mapper_path(name: str) -> str:
    return f"/dev/mapper/{name}"


def is_open(name: str) -> bool:
    return os.path.exists(mapper_path(name))


def luks_open(runner: Runner, device: str, name: str, key: bytes) -> str:
    if not is_open(name):
        runner.run(["cryptsetup", "open", "--type", "luks2", "--key-file", "-", device, name],
                   secret_stdin=bytes(key))
    return mapper_path(name)


def luks_close(runner: Runner, name: str) -> None:
    if is_open(name):
        runner.run(["cryptsetup", "close", name])


def test_passphrase_exit(runner: Runner, device: str, key: bytes) -> int:
    """Exit code of trying `key` against the header: 0 means the key still opens it."""
    return runner.run(["cryptsetup", "open", "--test-passphrase", "--type", "luks2",
                       "--key-file", "-", device], secret_stdin=bytes(key), check=False).exit


def keyslot_count(runner: Runner, device: str) -> int:
    """Keyslots left in the LUKS2 header, read from its JSON metadata."""
    dump = runner.run(["cryptsetup", "luksDump", "--dump-json-metadata", device])
    try:
        return len(json.loads(dump.stdout)["keyslots"])
    except (ValueError, KeyError) as exc:
        raise OperationFailed("key_destroy_failed", f"unreadable luksDump of {device}: {exc}") from None


def luks_erase(runner: Runner, device: str) -> None:
    """Erase every keyslot. Without a keyslot the volume key exists nowhere: crypto erase."""
    runner.run(["cryptsetup", "luksErase", "--batch-mode", device], code="key_destroy_failed")
