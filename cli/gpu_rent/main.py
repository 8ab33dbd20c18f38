"""`gpu-rent`: the argument parser and the dispatch; the commands are in commands.py."""
import argparse
import os
import sys

from . import __version__, commands, config, verify
from .client import Api
from .errors import OK, CliError, epilog
from .output import emit_json

SORTS = ("price", "per-gpu-hour", "vram", "free", "name")


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: given after the subcommand it counts; not given, the top level's stays.
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    common.add_argument("--url", default=argparse.SUPPRESS, help="the storefront's address")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(prog="gpu-rent", description="Rent dedicated GPUs from the command line.",
                                     epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"gpu-rent {__version__}")
    parser.add_argument("--json", action="store_true", default=False, help="print JSON")
    parser.add_argument("--url", default=None, help="the storefront's address (default: from login)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, help_text, **kw):
        return sub.add_parser(name, help=help_text, parents=[common], description=help_text, **kw)

    p = add("login", "store a token (made on the account settings page) for this server")
    p.add_argument("--token-stdin", action="store_true", help="read the token from standard input")
    add("logout", "forget the stored token")
    add("whoami", "the account, the token's scopes and the balance")

    p = add("offers", "offers with prices and free GPUs per site")
    p.add_argument("--gpu", help="GPU model, e.g. 4090 or h100")
    p.add_argument("--gpus", type=int, help="GPUs per offer")
    p.add_argument("--site", "--region", dest="site", help="only offers with free GPUs at this site")
    p.add_argument("--min-vram", type=int, metavar="GB", help="at least this much VRAM per GPU")
    p.add_argument("--vendor", choices=["nvidia", "amd"])
    p.add_argument("--cycle", choices=["week", "month"], default="week", help="price column (default week)")
    p.add_argument("--max-price", type=float, metavar="USD", help="at most this per cycle")
    p.add_argument("--available", action="store_true", help="only offers with free GPUs")
    p.add_argument("--sort", choices=SORTS, default="price")
    p.add_argument("--desc", action="store_true", help="sort descending")

    p = add("estimate", "VRAM and cost for a fine-tuning job (the calculator's inputs)")
    for flag in ("model", "params", "method", "seq", "batch", "gpus", "lora-rank", "lora-targets", "zero",
                 "offload", "tokens", "epochs", "framework", "utilisation"):
        p.add_argument(f"--{flag}")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="any other calculator input")

    p = add("create", "order a GPU server; pays from the balance or prints the invoice")
    p.add_argument("--gpu", help="GPU model, e.g. 4090 (with --gpus: which offer)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs (default 1)")
    p.add_argument("--offer", help="an offer slug instead of --gpu/--gpus")
    p.add_argument("--site", "--region", dest="site", required=True, help="site code, e.g. DFW-1")
    p.add_argument("--image", help="image slug (default: the vendor's PyTorch image)")
    p.add_argument("--cycle", choices=["week", "month"], required=True)
    p.add_argument("--key", help="name of a saved SSH key (default: the only one saved)")
    p.add_argument("--key-file", help="an SSH public key file instead of a saved key")
    p.add_argument("--pay", choices=["auto", "balance", "invoice"], default="auto",
                   help="auto: from the balance when it covers the order, else an invoice")
    p.add_argument("--coin", help="with an invoice: also print payment details in this coin (e.g. LTC)")
    for addon in ("extra-nvme-tb", "network-volume-tb"):  # snapshots: taken from a running lease
        p.add_argument(f"--{addon}", type=int, default=0)
    _wait_flags(p)

    add("ls", "your leases")
    p = add("show", "one lease with its events")
    p.add_argument("lease", type=int)
    p = add("wait", "wait until a lease's instance is ready")
    p.add_argument("lease", type=int)
    _wait_flags(p, flag=False)
    p = add("ssh", "connect to a lease's instance with ssh (extra arguments after --)")
    p.add_argument("lease", type=int)
    p.add_argument("ssh_args", nargs=argparse.REMAINDER)
    for action in ("restart", "stop", "start"):
        p = add(action, f"{action} the instance (files on the disk are kept)")
        p.add_argument("lease", type=int)
    p = add("extend", "pay the lease's next term now (from the balance, or an invoice)")
    p.add_argument("lease", type=int)
    p.add_argument("--pay", choices=["auto", "balance", "invoice"], default="auto")
    p.add_argument("--coin", help="with an invoice: also print payment details in this coin")
    p = add("auto-renew", "renew this lease from the balance: on, off, or as the account")
    p.add_argument("lease", type=int)
    p.add_argument("choice", choices=["on", "off", "default"])
    p = add("refund", "cancel a lease within its refund window; what was paid returns to the balance")
    p.add_argument("lease", type=int)
    p.add_argument("--yes", action="store_true", help="do not ask")

    keys = add("keys", "saved SSH keys").add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    p = keys.add_parser("add", help="save a public key", parents=[common])
    p.add_argument("name")
    p.add_argument("file", help="public key file, or - for standard input")
    keys.add_parser("ls", help="list saved keys", parents=[common])
    p = keys.add_parser("rm", help="delete a saved key (running leases keep theirs)", parents=[common])
    p.add_argument("key", help="name or id")

    add("volumes", "your network volumes")
    add("snapshots", "your snapshots")
    p = add("invoices", "your invoices")
    p.add_argument("--state", choices=["open", "paid", "expired", "void"])
    verify.add_parser(add)      # offline: no token, no server
    return parser


def _wait_flags(p, flag: bool = True) -> None:
    if flag:
        p.add_argument("--wait", action="store_true", help="wait until the instance is ready, showing progress")
    p.add_argument("--timeout", type=float, default=1800, metavar="SECONDS", help="give up waiting after this")
    p.add_argument("--poll", type=float, default=5, metavar="SECONDS", help="check this often")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stored = config.load()
    url = args.url or stored.get("url", "")
    try:
        if args.command == "login":
            return commands.login(args, url)
        if args.command == "logout":
            return commands.logout(args)
        if args.command == "verify-record":
            return verify.run(args)
        api = Api(url, stored.get("token", "") if url.rstrip("/") == stored.get("url", "").rstrip("/") or
                  not stored.get("url") else "")
        handler = getattr(commands, "cmd_" + args.command.replace("-", "_"))
        code = handler(api, args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at exit
        return code
    except CliError as exc:
        if args.json:
            emit_json(exc.as_json())
        print(f"gpu-rent: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`gpu-rent ls | head`): stop quietly; what is still buffered goes
        # to /dev/null, so the interpreter's own flush at exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return OK


if __name__ == "__main__":
    raise SystemExit(main() or OK)
