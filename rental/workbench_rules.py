"""The workbench's rules (rental.workbench): what a customer may name as an image, a
variable, a secret, a start command or a published port, each refusal a Problem with its
field, code and message; pure functions over values, no database."""

import ipaddress
import re
from typing import NamedTuple

from django.conf import settings
from django.utils.translation import gettext as _

#: Every source address, IPv4 and IPv6: what a port allows when the customer names none.
ANYONE = ["0.0.0.0/0", "::/0"]
SSH_PORT = 22
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
DOMAIN_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?$")
PATH_COMPONENT_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DIGEST_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$")
IMAGE_REF_MAX = 255
DOCKER_HUB = "docker.io"
DOCKER_HUB_ALIASES = {"docker.io", "index.docker.io", "registry-1.docker.io"}


class Problem(NamedTuple):
    field: str      # image_ref, registry_credential, start_command, env, secrets, ports, name, …
    code: str       # stable, for programs: image_ref_invalid, env_name_reserved, port_ssh, …
    message: str    # for the customer


class WorkbenchRefused(Exception):
    """Bad input: every problem found, not only the first."""

    def __init__(self, problems: list[Problem]):
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems

    @property
    def code(self) -> str:
        return self.problems[0].code

    def by_field(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in self.problems:
            out.setdefault(p.field, []).append(p.message)
        return out

    def codes(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in self.problems:
            out.setdefault(p.field, []).append(p.code)
        return out


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


# --- validators ---------------------------------------------------------------------------

def image_ref_problems(ref, where: str = "image_ref") -> list[Problem]:
    """A registry reference as `docker pull` takes it: [registry[:port]/]path[:tag][@digest]."""
    bad = Problem(where, "image_ref_invalid", _(
        "“%(ref)s” is not an image reference: give e.g. ghcr.io/org/name:tag or pytorch/pytorch:latest "
        "(lower-case path, optional registry, tag and digest).") % {"ref": str(ref)[:80]})
    if not isinstance(ref, str) or not ref or ref != ref.strip() or any(c.isspace() for c in ref):
        return [bad]
    if len(ref) > IMAGE_REF_MAX:
        return [Problem(where, "image_ref_too_long", _("An image reference has at most %(n)d characters.")
                        % {"n": IMAGE_REF_MAX})]
    name, _at, digest = ref.partition("@")
    if _at and not DIGEST_RE.match(digest):
        return [bad]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name[:len(name) - len(last)] + last.split(":", 1)[0], last.split(":", 1)[1]
        if not TAG_RE.match(tag):
            return [bad]
    parts = name.split("/")
    if len(parts) > 1 and _is_domain(parts[0]):
        if not DOMAIN_RE.match(parts[0]):
            return [bad]
        parts = parts[1:]
    if not parts or not all(PATH_COMPONENT_RE.match(p) for p in parts):
        return [bad]
    return []


def _is_domain(first: str) -> bool:
    return "." in first or ":" in first or first == "localhost" or first != first.lower()


def registry_of(ref: str) -> str:
    """The registry an image reference pulls from (docker.io when it names none)."""
    first, slash, _rest = ref.partition("/")
    return first.lower() if slash and _is_domain(first) else DOCKER_HUB


def same_registry(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a == b or (a in DOCKER_HUB_ALIASES and b in DOCKER_HUB_ALIASES)


def env_name_problems(name, where: str) -> list[Problem]:
    if not isinstance(name, str) or not ENV_NAME_RE.match(name):
        return [Problem(where, "env_name_invalid", _(
            "“%(name)s” is not a variable name: letters, digits and _, not starting with a digit.")
            % {"name": str(name)[:60]})]
    if len(name) > settings.WORKBENCH_MAX_ENV_NAME_LENGTH:
        return [Problem(where, "env_name_too_long", _("A variable name has at most %(n)d characters.")
                        % {"n": settings.WORKBENCH_MAX_ENV_NAME_LENGTH})]
    if name in settings.WORKBENCH_RESERVED_ENV_NAMES or \
            any(name.startswith(p) for p in settings.WORKBENCH_RESERVED_ENV_PREFIXES):
        return [Problem(where, "env_name_reserved", _(
            "%(name)s is set by the instance itself and cannot be changed (reserved: %(names)s and names "
            "starting with %(prefixes)s).") % {"name": name, "names": ", ".join(settings.WORKBENCH_RESERVED_ENV_NAMES),
                                               "prefixes": ", ".join(settings.WORKBENCH_RESERVED_ENV_PREFIXES)})]
    return []


def env_value_problems(name: str, value, where: str) -> list[Problem]:
    if not isinstance(value, str):
        return [Problem(where, "env_value_invalid", _("The value of %(name)s must be text.") % {"name": name})]
    if "\x00" in value:
        return [Problem(where, "env_value_invalid", _("The value of %(name)s contains a NUL character.")
                        % {"name": name})]
    if _utf8_len(value) > settings.WORKBENCH_MAX_ENV_VALUE_BYTES:
        return [Problem(where, "env_value_too_long", _("The value of %(name)s is longer than %(n)d bytes.")
                        % {"name": name, "n": settings.WORKBENCH_MAX_ENV_VALUE_BYTES})]
    return []


def variables_problems(values, where: str) -> list[Problem]:
    """A {name: value} mapping of variables or of secrets."""
    if not isinstance(values, dict):
        return [Problem(where, "env_invalid", _("Give the variables as NAME=value pairs."))]
    problems = []
    for name, value in values.items():
        problems += env_name_problems(name, where) or env_value_problems(name, value, where)
    return problems


def totals_problems(env: dict, secrets: dict, where: str = "env") -> list[Problem]:
    """Count and size of one lease's (or account's) variables and secrets together."""
    both = {**env, **secrets}
    problems = []
    if len(both) > settings.WORKBENCH_MAX_ENV:
        problems.append(Problem(where, "env_too_many", _("At most %(n)d variables and secrets together.")
                                % {"n": settings.WORKBENCH_MAX_ENV}))
    total = sum(_utf8_len(k) + _utf8_len(v) for k, v in both.items() if isinstance(v, str))
    if total > settings.WORKBENCH_MAX_ENV_TOTAL_BYTES:
        problems.append(Problem(where, "env_too_large", _(
            "Variables and secrets together are %(size)d bytes; at most %(n)d.")
            % {"size": total, "n": settings.WORKBENCH_MAX_ENV_TOTAL_BYTES}))
    both_named = sorted(set(env) & set(secrets))
    if both_named:
        problems.append(Problem("secrets", "env_duplicate", _(
            "%(names)s is given both as a variable and as a secret: keep one.") % {"names": ", ".join(both_named)}))
    return problems


def start_command_problems(command) -> list[Problem]:
    if not isinstance(command, str) or "\x00" in command:
        return [Problem("start_command", "start_command_invalid", _("The start command must be text."))]
    if _utf8_len(command) > settings.WORKBENCH_MAX_START_COMMAND_BYTES:
        return [Problem("start_command", "start_command_too_long", _("The start command has at most %(n)d bytes.")
                        % {"n": settings.WORKBENCH_MAX_START_COMMAND_BYTES})]
    return []


def clean_cidr(text) -> str:
    """A source network as the node's firewall takes it ("203.0.113.0/24", "2001:db8::/32");
    a bare address is that one host. ValueError when it is neither."""
    if not isinstance(text, str) or not text.strip() or len(text) > 64:
        raise ValueError(text)
    return str(ipaddress.ip_network(text.strip(), strict=False))


def clean_ports(items) -> tuple[list[dict], list[Problem]]:
    """[{"port": 8888, "allow": [CIDR, …]}] (allow missing or empty: anyone), normalised:
    each port once, in order, its networks canonical and each once."""
    if not isinstance(items, list):
        return [], [Problem("ports", "ports_invalid", _("Give the ports as a list."))]
    problems, out, seen = [], [], set()
    if len(items) > settings.WORKBENCH_MAX_PORTS:
        problems.append(Problem("ports", "ports_too_many", _("At most %(n)d ports per lease.")
                                % {"n": settings.WORKBENCH_MAX_PORTS}))
    for item in items:
        if type(item) is int:
            item = {"port": item}
        port = item.get("port") if isinstance(item, dict) else None
        if type(port) is not int or not 0 < port < 65536:
            problems.append(Problem("ports", "port_invalid", _("“%(port)s” is not a TCP port (1 to 65535).")
                                    % {"port": str(port if isinstance(item, dict) else item)[:20]}))
            continue
        if port == SSH_PORT:
            problems.append(Problem("ports", "port_ssh", _(
                "Port 22 is the instance's SSH, published already: choose another port.")))
            continue
        if port in seen:
            problems.append(Problem("ports", "port_duplicate", _("Port %(port)d is listed twice.") % {"port": port}))
            continue
        seen.add(port)
        allow = item.get("allow") or list(ANYONE)
        if not isinstance(allow, list):
            problems.append(Problem("ports", "cidr_invalid", _("Give port %(port)d's sources as a list of networks.")
                                    % {"port": port}))
            continue
        if len(allow) > settings.WORKBENCH_MAX_CIDRS_PER_PORT:
            problems.append(Problem("ports", "cidr_too_many", _("Port %(port)d lists more than %(n)d networks.")
                                    % {"port": port, "n": settings.WORKBENCH_MAX_CIDRS_PER_PORT}))
            continue
        networks = []
        for text in allow:
            try:
                network = clean_cidr(text)
            except ValueError:
                problems.append(Problem("ports", "cidr_invalid", _(
                    "“%(cidr)s” (port %(port)d) is not an IPv4 or IPv6 network such as 203.0.113.0/24 or "
                    "2001:db8::/32.") % {"cidr": str(text)[:64], "port": port}))
                continue
            if network not in networks:
                networks.append(network)
        out.append({"port": port, "allow": networks})
    return out, problems


def parse_port_spec(text: str) -> dict:
    """"8888" or "8888:203.0.113.0/24,2001:db8::/32" (the order form's and the CLI's way of
    writing a port) → {"port": 8888, "allow": [...]}; the networks are checked later."""
    text = text.strip()
    port, _colon, allow = text.partition(":")
    try:
        number = int(port)
    except ValueError:
        number = port       # refused with its text by clean_ports
    return {"port": number, "allow": [a.strip() for a in allow.split(",") if a.strip()]}


def parse_assignments(text: str, where: str) -> tuple[dict[str, str], list[Problem]]:
    """NAME=value lines (the pages' text areas); blank lines and # comments skipped."""
    values, problems = {}, []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, eq, value = line.partition("=")
        if not eq:
            problems.append(Problem(where, "env_line_invalid", _("Line %(n)d is not NAME=value.") % {"n": number}))
            continue
        values[name.strip()] = value
    return values, problems


def format_ports(ports: list[dict]) -> str:
    """The inverse of parse_port_spec, one port a line (for the pages' text areas)."""
    return "\n".join(str(p["port"]) + ("" if p["allow"] == ANYONE else ":" + ",".join(p["allow"])) for p in ports)
