"""`gpu-node-agent enrol | run | status | images pull|prune | verify-record | boot-filter`
(console script)."""
import argparse
import json
import logging
import signal
import socket
import sys
import threading
from pathlib import Path

from . import __version__
from .agent import Agent, NotEnrolled, warn_if_cleartext
from .client import StorefrontClient, StorefrontRefused, StorefrontUnreachable
from .config import DEFAULT_CONFIG_PATH, AgentConfig, ConfigError, load_config
from .gpu import open_gpu_probe
from .interfaces import OperationFailed
from .netfilter import boot_table
from .signing import NodeKey
from .state import StateDir, read_json, write_atomic, write_json

log = logging.getLogger("nodeagent")
EXIT_NOT_ENROLLED, EXIT_CONFIG, EXIT_REFUSED, EXIT_UNREACHABLE = 2, 3, 4, 5


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = _config(args.config)
        return args.command(config, args)
    except ConfigError as exc:
        log.error("configuration: %s", exc)
        return EXIT_CONFIG
    except NotEnrolled as exc:
        log.error("refusing to run: %s", exc)
        return EXIT_NOT_ENROLLED


def enrol(config: AgentConfig, args) -> int:
    """Generate a fresh Ed25519 key, trade the one-time code for a node credential. The
    new key replaces the old one only once the storefront accepted it. A node that fails
    a start check (nodeagent/preflight.py) is not enrolled: it could not run a lease."""
    refused = _preflight(config, _probe(config), "enrol")
    if refused is not None:
        return refused
    state = StateDir(config.state_dir)
    state.ensure()
    pending = state.root / "node-key.pending.pem"
    key = NodeKey.generate(pending)
    warn_if_cleartext(args.url)
    client = StorefrontClient(args.url, verify=config.tls_verify, timeout=config.request_timeout)
    try:
        answer = client.enrol(code=args.code, public_key=key.public_key_b64(),
                              hostname=socket.gethostname())
    except StorefrontRefused as exc:
        pending.unlink()
        log.error("enrolment refused (%s): ask the operator for a new code", exc.error)
        return EXIT_REFUSED
    except StorefrontUnreachable as exc:
        pending.unlink()
        log.error("storefront unreachable: %s", exc)
        return EXIT_UNREACHABLE
    pending.replace(state.key_path)
    write_json(state.enrolment_path, {"url": client.url, "node": answer["node"],
                                      "credential": answer["credential"],
                                      "poll_seconds": answer.get("poll_seconds", 15)})
    print(f"enrolled as node {answer['node']} at {client.url}")
    return 0


def run(config: AgentConfig, args) -> int:
    probe = _probe(config)
    refused = _preflight(config, probe, "run")
    if refused is not None:
        return refused
    try:
        agent = Agent(config, probe=probe)
    except OperationFailed as exc:       # e.g. docker not answering: systemd restarts us
        log.error("cannot start: %s", exc)
        return 1
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    agent.run_forever(stop)
    return 0


def status(config: AgentConfig, args) -> int:
    state = StateDir(config.state_dir)
    enrolment = read_json(state.enrolment_path, {})
    shown = {"agent_version": __version__, "state_dir": str(state.root),
             "enrolled": bool(enrolment.get("credential")) and state.key_path.exists(),
             "node": enrolment.get("node"), "storefront": enrolment.get("url"),
             **read_json(state.status_path, {})}
    print(json.dumps(shown, indent=2, sort_keys=True))
    return 0 if shown["enrolled"] else EXIT_NOT_ENROLLED


def images(config: AgentConfig, args) -> int:
    """`images pull`: pull every image of `[images]` that is not on the node yet (before
    enabling the service, or after changing the table). `images prune`: remove the images
    the agent pulled that are no longer configured and that no container uses."""
    from docker.errors import DockerException, ImageNotFound

    from .runtime.images import ImagePuller

    puller = ImagePuller(config.docker.socket, config.state_dir / "runtime" / "images.json",
                         keep=frozenset(config.images.values()))
    failed = 0
    try:
        if args.action == "prune":
            for ref in puller.prune():
                print(f"removed {ref}")
            return 0
        for slug, ref in sorted(config.images.items()):
            try:
                puller.client().images.get(ref)
                print(f"{slug}: {ref} present")
                continue
            except ImageNotFound:
                pass
            try:
                puller.pull(ref)
                print(f"{slug}: {ref} pulled")
            except (DockerException, OperationFailed) as exc:
                failed += 1
                log.error("%s: pulling %s failed: %s", slug, ref, exc)
    except DockerException as exc:
        log.error("docker at %s: %s", config.docker.socket, exc)
        return 1
    return 1 if failed else 0


def verify_record(config: AgentConfig, args) -> int:
    """Check a sanitization record offline (no enrolment, no network). Exit status in
    nodeagent/records.py: 0 proven, 1 a proof fails, 6 a wipe proof is missing."""
    from .records import EXIT_BAD, exit_status
    from .records import verify_record as check

    try:
        with open(args.file, encoding="utf-8") as f:
            document = json.load(f)
    except (OSError, ValueError) as exc:
        log.error("cannot read %s: %s", args.file, exc)
        return EXIT_BAD
    if not args.node_key:
        print("WARNING: no --node-key given: each signature was checked only against the public key written "
              "in the record itself. That proves the record was not changed after it was signed, not which "
              "server signed it; pass each server's published key with --node-key.", file=sys.stderr)
    results = check(document, node_key=args.node_key)
    for result in results:
        print(f"{'OK ' if result.ok else 'MISSING' if result.missing else 'BAD'} {result.kind}: {result.summary}")
    return exit_status(results)


def _probe(config: AgentConfig):
    return open_gpu_probe(max_temperature_c=config.max_temperature_c, min_cuda=config.min_cuda)


def _preflight(config: AgentConfig, probe, what: str) -> int | None:
    """The node's start checks: None when it may go on, else the exit status (3: systemd
    does not restart it; the messages name each fix)."""
    from . import preflight

    try:
        info = preflight.docker_info(config.docker.socket)
    except OperationFailed as exc:       # dockerd still starting: systemd restarts us
        log.error("cannot start: %s", exc)
        return 1
    problems = preflight.node_problems(config, info, gpu_count=len(probe.inventory()))
    refusals = preflight.refusals(problems, config.preflight_waive)
    for problem in refusals:
        log.error("refusing to %s: %s", what, problem)
    return EXIT_CONFIG if refusals else None


def _config(path: str | None) -> AgentConfig:
    if path is None and not Path(DEFAULT_CONFIG_PATH).exists():
        return AgentConfig()              # enrol/status work before a config exists
    return load_config(path or DEFAULT_CONFIG_PATH)


def boot_filter(config: AgentConfig, args) -> int:
    """Forwarding is dropped from boot on, before the agent ever ran (netfilter.boot_table)."""
    table = boot_table(blocked_networks=config.docker.blocked_networks,
                       masquerade=config.docker.masquerade)
    write_atomic(Path(args.write), table, mode=0o644)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-node-agent",
                                     description="GPU node agent for the storefront")
    parser.add_argument("--config", help=f"TOML config file (default {DEFAULT_CONFIG_PATH})")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(required=True)
    p = commands.add_parser("enrol", help="exchange a one-time code for a node credential")
    p.add_argument("--url", required=True, help="the storefront, e.g. https://shop.example")
    p.add_argument("--code", required=True, help="the enrolment code from the admin")
    p.set_defaults(command=enrol)
    commands.add_parser("run", help="the agent loop (systemd runs this)").set_defaults(
        command=run)
    commands.add_parser("status", help="enrolment and the last report").set_defaults(
        command=status)
    p = commands.add_parser("images", help="pre-pull the configured images, or prune old ones")
    p.add_argument("action", choices=("pull", "prune"))
    p.set_defaults(command=images)
    p = commands.add_parser("verify-record", help="check a customer's sanitization record",
                            epilog="exit status: 0 every proof checks out and every destroyed key has its "
                                   "wipe proof; 1 a proof does not check out; 6 the proofs check out but a "
                                   "disk's wipe proof is missing")
    p.add_argument("file", help="the record (JSON) downloaded from the lease page or the API")
    p.add_argument("--node-key", action="append",
                   help="a server's public key (base64) the proofs must be signed with; once per server "
                        "(a move leaves proofs of two)")
    p.set_defaults(command=verify_record)
    p = commands.add_parser("boot-filter", help="write the packet filter without leases, for "
                            "nftables.service at boot (install-node.sh)")
    p.add_argument("--write", required=True, metavar="PATH")
    p.set_defaults(command=boot_filter)
    return parser


if __name__ == "__main__":
    sys.exit(main())
