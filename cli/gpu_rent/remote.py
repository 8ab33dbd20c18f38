"""The SSH connection `gpu-rent cp` copies over, made with paramiko (so a customer needs no
ssh or rsync installed): the lease's host and port come from the API, the key is the user's
(ssh-agent, `-i KEY`, or ~/.ssh's usual key files, like ssh), and the instance's host key is
checked against the CLI's own known_hosts file.

How the host key is checked: the store does not publish its instances' host keys (each
instance's sshd makes its own when the instance is created), so the first connection to a
lease trusts the key it is shown, says so with its fingerprint, and keeps it in
<config dir>/known_hosts (0600) under the name `lease-ID@[HOST]:PORT`. Every later
connection to that lease at that address must show the same key, or nothing is sent. The
lease id is part of the name because a node hands a port back out when a lease ends: a new
lease on an old address is a new machine, not an impostor, while a changed key on the same
lease is refused."""
from __future__ import annotations

import getpass
import logging
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import config
from .errors import HOST_KEY, SSH_AUTH, SSH_FAILED, USAGE, CliError

CONNECT_TIMEOUT_SECONDS = 30    #: TCP connect, the server's banner and the authentication each
KEEPALIVE_SECONDS = 15          #: a broken link shows as an error, not a hang



def _paramiko():
    """Imported on use: only `cp` needs it, and every other command starts without its cost."""
    try:
        import paramiko
    except ImportError:  # a broken install
        raise CliError(USAGE, "`gpu-rent cp` needs paramiko: pip install 'paramiko==5.0.0' "
                              "(or reinstall gpu-rent).") from None
    # paramiko logs a broken link as an ERROR with a traceback; the CLI says it once, in its words
    quiet = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in quiet.handlers):
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
    return paramiko


def known_hosts_path() -> Path:
    return config.config_dir() / "known_hosts"


def host_entry(lease_id: int, host: str, port: int) -> str:
    return f"lease-{lease_id}@[{host}]:{port}"


@dataclass
class Connection:
    client: object          # paramiko.SSHClient
    sftp: object            # paramiko.SFTPClient
    lease_id: int
    host_key: dict = field(default_factory=dict)   # fingerprint, type, first_use

    def close(self) -> None:
        for part in (self.sftp, self.client):
            try:
                part.close()
            except Exception:  # noqa: BLE001 - closing a dead connection
                pass


def _save_host_key(path: Path, name: str, key) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as handle:
        handle.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def _trust_on_first_use(paramiko, lease_id: int, name: str, path: Path, seen: dict, quiet: bool):
    """paramiko's policy for a host with no key kept yet: keep this one, and say so."""

    class TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            _save_host_key(path, name, key)
            seen.update(fingerprint=key.fingerprint, type=key.get_name(), first_use=True)
            if not quiet:
                print(f"gpu-rent: first connection to lease #{lease_id}'s instance ({hostname}): trusting its "
                      f"host key {key.get_name()} {key.fingerprint}, kept in {path}. Later connections must "
                      "show the same key.", file=sys.stderr, flush=True)

    return TrustOnFirstUse()


def _load_key(paramiko, key_file: str):
    """The private key of `-i`, asking for its passphrase on a terminal when it has one."""
    path = os.path.expanduser(key_file)
    if not os.path.isfile(path):
        raise CliError(USAGE, f"Cannot read the key {key_file}: no such file.")
    unreadable = (paramiko.SSHException, paramiko.UnknownKeyType, ValueError, OSError)
    try:
        return paramiko.PKey.from_path(path)
    except (paramiko.PasswordRequiredException, TypeError):  # cryptography: "password was not provided"
        pass
    except unreadable as exc:
        raise CliError(USAGE, f"Cannot read the key {key_file}: {exc}") from None
    if not sys.stdin.isatty():
        raise CliError(SSH_AUTH, f"The key {key_file} is protected by a passphrase: run on a terminal to type it, "
                                 "or load it into ssh-agent (ssh-add) and leave out -i.", error="ssh_key_encrypted")
    passphrase = getpass.getpass(f"Passphrase for {key_file}: ")
    try:
        return paramiko.PKey.from_path(path, passphrase)
    except (*unreadable, TypeError):
        raise CliError(SSH_AUTH, f"Cannot open the key {key_file}: wrong passphrase?",
                       error="ssh_key_unreadable") from None


def connect(lease_id: int, host: str, port: int, *, user: str = "root", key_file: str | None = None,
            quiet: bool = False) -> Connection:
    """An SFTP session on the lease's instance; every failure a CliError with its exit code."""
    paramiko = _paramiko()
    path, name = known_hosts_path(), host_entry(lease_id, host, port)
    kept = paramiko.HostKeys()
    if path.exists():
        try:
            kept.load(str(path))
        except (OSError, paramiko.SSHException) as exc:
            raise CliError(HOST_KEY, f"Cannot read {path}: {exc}", error="known_hosts_unreadable") from None
    client = paramiko.SSHClient()
    lookup = host if port == 22 else f"[{host}]:{port}"   # the name paramiko looks the server up by
    seen: dict = {}
    for keytype, key in (kept.lookup(name) or {}).items():
        client.get_host_keys().add(lookup, keytype, key)
        seen.update(fingerprint=key.fingerprint, type=keytype, first_use=False)
    client.set_missing_host_key_policy(_trust_on_first_use(paramiko, lease_id, name, path, seen, quiet))
    pkey = _load_key(paramiko, key_file) if key_file else None
    where = f"lease #{lease_id}'s instance ({user}@{host} port {port})"
    try:
        client.connect(host, port=port, username=user, pkey=pkey, allow_agent=True, look_for_keys=pkey is None,
                       timeout=CONNECT_TIMEOUT_SECONDS, banner_timeout=CONNECT_TIMEOUT_SECONDS,
                       auth_timeout=CONNECT_TIMEOUT_SECONDS)
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise CliError(
            HOST_KEY,
            f"The host key of {where} is not the one kept from the first connection: it shows "
            f"{exc.key.get_name()} {exc.key.fingerprint}, it was {exc.expected_key.fingerprint}. Nothing was sent. "
            f"Someone may be intercepting the connection. If the instance was re-created on purpose (a new "
            f"image, a restore), delete the line starting `{name}` from {path} and run again.",
            error="host_key_changed", detail={"shown": exc.key.fingerprint,
                                              "kept": exc.expected_key.fingerprint}) from None
    except paramiko.AuthenticationException as exc:
        client.close()
        tried = f"the key {key_file}" if key_file else "the keys in ssh-agent and ~/.ssh"
        raise CliError(SSH_AUTH, f"{where} refused {tried} ({exc}). Give the private key whose public half "
                                 "the lease was ordered with: -i ~/.ssh/id_ed25519, or load it into ssh-agent.",
                       error="ssh_auth_refused") from None
    except (OSError, EOFError, paramiko.SSHException) as exc:
        client.close()
        raise CliError(SSH_FAILED, f"Cannot connect to {where}: {_reason(exc)}", error="ssh_failed") from None
    client.get_transport().set_keepalive(KEEPALIVE_SECONDS)
    try:
        sftp = client.open_sftp()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        client.close()
        raise CliError(SSH_FAILED, f"{where} has no SFTP service ({_reason(exc)}): its image's sshd needs the "
                                   "sftp subsystem.", error="no_sftp") from None
    return Connection(client=client, sftp=sftp, lease_id=lease_id, host_key=seen)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    return f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__
