"""One function per command: call the API, print JSON (--json) or text, return the exit code.
The account, offers, ordering, leases, keys and invoices are here; the storage, workbench and
account-wide commands in storage_commands.py, workbench_commands.py and account_commands.py."""
import getpass
import os
import re
import shutil
import sys
import time

from . import config
from .client import Api
from .errors import LEASE_ENDED, NOT_FOUND, OK, REFUSED, USAGE, WAIT_TIMEOUT, CliError
from .output import emit_json, fields, listing, progress, reply, table
from .workbench_commands import looks_like_image_ref, workbench_order_fields

LEASE_COLUMNS = [("id", "ID"), ("state", "STATE"), ("offer", "OFFER"), ("site", "SITE"), ("term", "TERM"),
                 ("price_usd", "USD/TERM"), ("ends_at", "ENDS (UTC)"), ("auto_renew", "AUTO-RENEW"), ("ssh", "SSH")]


ENDED = ("cancelled", "failed", "released", "wiped")


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(text).lower())


def login(args, url: str) -> int:
    if not url:
        raise CliError(USAGE, "Give the server: gpu-rent login --url https://shop.example")
    if args.token_stdin or not sys.stdin.isatty():
        token = sys.stdin.readline().strip()
    else:
        token = getpass.getpass("API token (from Account settings › API tokens): ").strip()
    me = Api(url, token).get("account")
    path = config.save({"url": url.rstrip("/"), "token": token})
    if args.json:
        emit_json({**me, "config": str(path)})
    else:
        print(f"Logged in to {url} as {me['username']} (scopes: {' '.join(me['token']['scopes'])}); "
              f"balance ${me['balance_usd']}. Token stored in {path} (mode 0600).")
    return OK


def logout(args) -> int:
    removed = config.forget()
    if args.json:
        emit_json({"logged_out": removed})
    else:
        print("Token forgotten." if removed else "No token was stored.")
    return OK


def cmd_whoami(api: Api, args) -> int:
    me = api.get("account")
    if args.json:
        emit_json(me)
    else:
        who = me["username"]
        if me.get("member") and me["member"] != me["username"]:   # a team member's token (teams)
            who = f"{me['member']} for {me['username']} ({me['role']})"
        print(f"{who} · scopes {' '.join(me['token']['scopes'])} · balance ${me['balance_usd']}")
    return OK


def _price_key(cycle: str) -> str:
    return "weekly_cents" if cycle == "week" else "monthly_cents"


def filter_offers(offers: list[dict], args) -> list[dict]:
    rows = offers
    if args.gpu:
        needle = _norm(args.gpu)
        rows = [o for o in rows if needle in _norm(o["gpu"]) or needle in _norm(o["slug"])]
    if args.gpus:
        rows = [o for o in rows if o["gpus"] == args.gpus]
    if args.vendor:
        rows = [o for o in rows if o["vendor"] == args.vendor]
    if args.min_vram:
        rows = [o for o in rows if o["vram_gb"] >= args.min_vram]
    if args.max_price is not None:
        rows = [o for o in rows if o[_price_key(args.cycle)] <= round(args.max_price * 100)]
    if args.site:
        rows = [o for o in rows if o["free_by_site"].get(args.site.upper(), 0) > 0]
    elif args.available:
        rows = [o for o in rows if o["free_total"] > 0]
    key = {"price": lambda o: o[_price_key(args.cycle)], "per-gpu-hour": lambda o: o["per_gpu_hour_cents"],
           "vram": lambda o: o["vram_gb"] * o["gpus"], "free": lambda o: o["free_total"],
           "name": lambda o: o["name"]}[args.sort]
    return sorted(rows, key=key, reverse=args.desc)


def cmd_offers(api: Api, args) -> int:
    rows = filter_offers(api.get("offers", auth=False)["offers"], args)
    if args.json:
        emit_json({"offers": rows})
        return OK
    price = "weekly_usd" if args.cycle == "week" else "monthly_usd"
    table([{**o, "free": " ".join(f"{s}:{n}" for s, n in o["free_by_site"].items() if n) or "0"} for o in rows],
          [("slug", "OFFER"), ("gpu", "GPU"), ("gpus", "GPUS"), ("vram_gb", "VRAM/GPU"),
           (price, f"USD/{args.cycle.upper()}"), ("per_gpu_hour_usd", "USD/GPU-HOUR"), ("free", "FREE")])
    return OK


def cmd_estimate(api: Api, args) -> int:
    params = {}
    for flag in ("model", "params", "method", "seq", "batch", "gpus", "lora_rank", "lora_targets", "zero",
                 "offload", "tokens", "epochs", "framework", "utilisation"):
        if getattr(args, flag) is not None:
            params[flag] = getattr(args, flag)
    for pair in args.set:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CliError(USAGE, f"--set takes NAME=VALUE, not {pair!r}")
        params[name] = value
    result = api.get("estimate", params=params, auth=False)
    if args.json:
        emit_json(result)
        return OK
    print(f"{result.get('model')} · {result.get('method')} · {result.get('gpus')} GPU(s): "
          f"{result.get('per_gpu_gb')} GB per GPU, {result.get('total_gb')} GB in all")
    for warning in result.get("warnings") or []:
        print(f"warning: {warning}")
    recs = result.get("recommendations") or []
    if recs:
        table([_estimate_row(o) for o in recs[:8]], ESTIMATE_COLUMNS + (
            ESTIMATE_RUN_COLUMNS if any(o.get("tokens_per_s") for o in recs) else []))
    return OK


#: the calculator's figures per offer, as the page's table shows them (cost to finish first)
ESTIMATE_COLUMNS = [("offer", "OFFER"), ("gpus", "GPUS"), ("mode", "MODE"), ("per_gpu_gb", "GB/GPU"),
                    ("max_micro_batch", "MAX-MICRO-BATCH"), ("weekly_usd", "USD/WEEK"), ("monthly_usd", "USD/MONTH")]


ESTIMATE_RUN_COLUMNS = [("tokens_per_s", "TOKENS/S"), ("run_hours", "HOURS"), ("hours_range", "HOURS-LIKELY"),
                        ("rental_cost_usd", "USD-TO-FINISH"), ("cost_range", "USD-LIKELY")]


def _estimate_row(o: dict) -> dict:
    def span(pair):
        return f"{pair[0]}-{pair[1]}" if pair else ""

    return {**o, "hours_range": span(o.get("run_hours_range")), "cost_range": span(o.get("rental_cost_range_usd"))}


def _choose_offer(api: Api, args) -> dict:
    offers = api.get("offers", auth=False)["offers"]
    if args.offer:
        found = [o for o in offers if o["slug"] == args.offer]
    else:
        if not args.gpu:
            raise CliError(USAGE, "Give --gpu (e.g. --gpu 4090) or --offer SLUG.")
        needle = _norm(args.gpu)
        found = [o for o in offers if (needle in _norm(o["gpu"]) or needle in _norm(o["slug"]))
                 and o["gpus"] == args.gpus]
    if not found:
        gpus = sorted({f"{o['gpu']} ({o['gpus']}x)" for o in offers})
        raise CliError(NOT_FOUND, "No offer matches; these are offered: " + ", ".join(gpus)
                       + " (see `gpu-rent offers`).")
    if len(found) > 1:
        raise CliError(USAGE, "Several offers match; give --offer with one of: "
                       + ", ".join(o["slug"] for o in found))
    return found[0]


def _public_key(api: Api, args) -> str:
    if args.key_file:
        try:
            with open(os.path.expanduser(args.key_file)) as handle:
                return handle.read().strip()
        except OSError as exc:
            raise CliError(USAGE, f"Cannot read {args.key_file}: {exc.strerror}") from exc
    keys = api.get("keys")["keys"]
    if args.key:
        match = [k for k in keys if k["name"] == args.key or str(k["id"]) == args.key]
        if not match:
            raise CliError(NOT_FOUND, f"No saved key named {args.key!r}; see `gpu-rent keys ls`.")
        return match[0]["public_key"]
    if len(keys) == 1:
        return keys[0]["public_key"]
    raise CliError(USAGE, "Give --key NAME (a saved key) or --key-file PATH"
                   + ("; you have no saved key: `gpu-rent keys add NAME ~/.ssh/id_ed25519.pub`." if not keys else "."))


def _from_balance(api: Api, pay: str, price_cents: int) -> bool:
    if pay != "auto":
        return pay == "balance"
    me = api.get("account")
    return "pay" in me["token"]["scopes"] and me["balance_cents"] >= price_cents


def _print_invoice(api: Api, invoice: dict, coin: str | None, as_json: bool, quote: dict | None = None) -> dict | None:
    if quote is None and coin and invoice["state"] == "open":
        quote = api.post(f"invoices/{invoice['id']}/quote", {"coin": coin})
    if as_json:
        return quote
    if invoice["state"] == "paid":
        print(f"Invoice #{invoice['id']}: ${invoice['amount_usd']} paid from the balance.")
        return quote
    print(f"Invoice #{invoice['id']}: ${invoice['amount_usd']} open"
          + (f", pay by {invoice['expires_at']}" if invoice.get("expires_at") else "") + ".")
    print(f"Pay it at {api.base}/pay/invoice/{invoice['id']}/")
    if quote:
        print(f"  send exactly {quote['amount']} {quote['coin']} to {quote['address']} before {quote['expires_at']}")
        print(f"  payment URI: {quote['uri']}")
    else:
        print("  (or add --coin LTC/BTC/ETH/… for the address and exact amount here)")
    return quote


def cmd_create(api: Api, args) -> int:
    offer = _choose_offer(api, args)
    body = {"offer": offer["slug"], "site": args.site.upper(), "term": args.cycle, "ssh_key": _public_key(api, args),
            "addons": {"extra_nvme_tb": args.extra_nvme_tb, "network_volume_tb": args.network_volume_tb}}
    if args.image:
        body["image" if not looks_like_image_ref(args.image) else "image_ref"] = args.image
    body.update(workbench_order_fields(args))
    body["pay_from_balance"] = _from_balance(api, args.pay, offer[_price_key(args.cycle)])
    if args.coin:  # the server checks the coin with the rest: a refused coin orders nothing
        body["coin"] = args.coin.upper()
    try:
        placed = api.post("orders", body)
    except CliError as exc:
        raise _with_valid_values(api, exc) from None
    lease, invoice = placed["lease"], placed["invoice"]
    quote = _print_invoice(api, invoice, None, args.json, quote=placed.get("quote"))
    if not args.json:
        print(f"Lease #{lease['id']}: {lease['offer']} at {lease['site']}, {lease['state']}.")
        for name, value in (placed.get("generated_secrets") or {}).items():   # shown once, here
            print(f"{name}={value}  (made for this lease; not shown again)")
    if args.wait:
        lease = wait_ready(api, lease["id"], timeout=args.timeout, poll=args.poll, quiet=args.json)
    if args.json:
        emit_json({"lease": lease, "invoice": invoice, "quote": quote,
                   **({"generated_secrets": placed["generated_secrets"]} if placed.get("generated_secrets") else {})})
    return OK


def _with_valid_values(api: Api, exc: CliError) -> CliError:
    """A refused site or image names the values this store takes (sites, images)."""
    fields = exc.detail.get("fields") or {}
    lines = []
    try:
        if "site" in fields:
            lines.append("valid sites: " + ", ".join(s["code"] for s in api.get("sites", auth=False)["sites"]))
        if "image" in fields:
            lines.append("valid images: " + ", ".join(i["slug"] for i in api.get("images", auth=False)["images"]))
    except CliError:
        return exc
    if lines:
        exc.message += "".join(f"\n  {line}" for line in lines)
    return exc


def wait_ready(api: Api, lease_id: int, *, timeout: float, poll: float, quiet: bool = False) -> dict:
    """Polls the lease until it is active with its SSH line; progress on stderr."""
    deadline, last = time.monotonic() + timeout, None
    words = {"pending": "waiting for payment", "provisioning": "paid; the server is preparing the instance",
             "active": "ready", "suspended": "suspended (term ended unpaid)"}
    while True:
        lease = api.get(f"leases/{lease_id}")
        if lease["state"] != last and not quiet:
            progress(f"lease #{lease_id}: {lease['state']} — {words.get(lease['state'], lease['state'])}")
        last = lease["state"]
        if lease["state"] == "active" and lease.get("ssh"):
            if not quiet:
                print(lease["ssh"]["command"])
            return lease
        if lease["state"] in ENDED:
            raise CliError(LEASE_ENDED, f"Lease #{lease_id} is {lease['state']}.", error="lease_ended",
                           detail={"lease": lease})
        if time.monotonic() + poll > deadline:
            raise CliError(WAIT_TIMEOUT, f"Lease #{lease_id} is still {lease['state']} after {timeout:g} s.",
                           error="wait_timeout", detail={"lease": lease})
        time.sleep(poll)


def cmd_wait(api: Api, args) -> int:
    lease = wait_ready(api, args.lease, timeout=args.timeout, poll=args.poll, quiet=args.json)
    if args.json:
        emit_json(lease)
    return OK


def _lease_row(lease: dict) -> dict:
    return {**lease, "ssh": (lease.get("ssh") or {}).get("command"),
            "auto_renew": "on" if lease.get("auto_renew") else "off"}


def cmd_ls(api: Api, args) -> int:
    leases = api.get("leases")["leases"]
    if args.json:
        emit_json({"leases": leases})
    else:
        table([_lease_row(lease) for lease in leases], LEASE_COLUMNS)
    return OK


def cmd_show(api: Api, args) -> int:
    lease = api.get(f"leases/{args.lease}")
    if args.json:
        emit_json(lease)
        return OK
    fields(_lease_row(lease), [key for key, _h in LEASE_COLUMNS] + ["image", "started_at", "refund_until",
                                                                     "hold_until", "addons"])
    for event in lease.get("events", []):
        print(f"  {event['at']}  {event['kind']}  {event.get('reason') or ''}".rstrip())
    return OK


def cmd_ssh(api: Api, args) -> int:
    lease = api.get(f"leases/{args.lease}")
    ssh = lease.get("ssh")
    if not ssh:
        raise CliError(REFUSED, f"Lease #{args.lease} is {lease['state']}: it has no SSH line now.", error="not_running")
    extra = args.ssh_args[1:] if args.ssh_args[:1] == ["--"] else args.ssh_args
    binary = os.environ.get("GPU_RENT_SSH") or shutil.which("ssh") or "ssh"
    argv = [binary, "-p", str(ssh["port"]), f"root@{ssh['host']}", *extra]
    if args.json:
        emit_json({"exec": argv})
    sys.stdout.flush()
    os.execvp(binary, argv)
    return OK  # not reached


def _instance(api: Api, args, action: str) -> int:
    done = api.post(f"leases/{args.lease}/{action}")
    if args.json:
        emit_json(done)
    else:
        print(done["message"])
    return OK


def cmd_restart(api: Api, args) -> int:
    return _instance(api, args, "restart")


def cmd_stop(api: Api, args) -> int:
    return _instance(api, args, "stop")


def cmd_start(api: Api, args) -> int:
    return _instance(api, args, "start")


def cmd_extend(api: Api, args) -> int:
    lease = api.get(f"leases/{args.lease}")
    done = api.post(f"leases/{args.lease}/extend",
                    {"pay_from_balance": _from_balance(api, args.pay, lease["price_cents"])})
    quote = _print_invoice(api, done["invoice"], args.coin, args.json) if done["invoice"]["state"] == "open" else None
    if args.json:
        emit_json({**done, "quote": quote})
    elif done["invoice"]["state"] == "paid":
        print(f"Lease #{args.lease} extended: paid until {done['lease']['ends_at']}.")
    return OK


def cmd_auto_renew(api: Api, args) -> int:
    lease = api.post(f"leases/{args.lease}/auto-renew", {"auto_renew": {"on": True, "off": False}.get(args.choice)})
    if args.json:
        emit_json(lease)
    else:
        print(f"Lease #{lease['id']}: auto-renew {'on' if lease['auto_renew'] else 'off'}"
              + (" (as the account)" if lease["auto_renew_setting"] is None else "") + ".")
    return OK


def cmd_refund(api: Api, args) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError(USAGE, "Refunding cancels the lease: add --yes.")
        if input(f"Cancel lease #{args.lease} and refund it to the balance? [y/N] ").strip().lower() != "y":
            return USAGE
    done = api.post(f"leases/{args.lease}/refund")
    if args.json:
        emit_json(done)
    else:
        print(f"Lease #{args.lease} cancelled; ${done['refunded_usd']} returned to the balance.")
    return OK


def cmd_keys(api: Api, args) -> int:
    if args.keys_command == "ls":
        keys = api.get("keys")["keys"]
        if args.json:
            emit_json({"keys": keys})
        else:
            table(keys, [("id", "ID"), ("name", "NAME"), ("fingerprint", "FINGERPRINT"), ("created_at", "ADDED")])
        return OK
    if args.keys_command == "add":
        try:
            text = sys.stdin.read() if args.file == "-" else open(os.path.expanduser(args.file)).read()
        except OSError as exc:
            raise CliError(USAGE, f"Cannot read {args.file}: {exc.strerror}") from exc
        key = api.post("keys", {"name": args.name, "public_key": text.strip()})
        emit_json(key) if args.json else print(f"Saved key {key['name']} ({key['fingerprint']}).")
        return OK
    keys = api.get("keys")["keys"]
    match = [k for k in keys if k["name"] == args.key or str(k["id"]) == args.key]
    if not match:
        raise CliError(NOT_FOUND, f"No saved key {args.key!r}.")
    done = api.delete(f"keys/{match[0]['id']}")
    emit_json(done) if args.json else print(f"Deleted key {match[0]['name']}.")
    return OK


def cmd_quote(api: Api, args) -> int:
    invoice = api.get(f"invoices/{args.invoice}")
    if invoice["state"] != "open":
        raise CliError(REFUSED, f"Invoice #{args.invoice} is {invoice['state']}: there is nothing to pay.")
    quote = _print_invoice(api, invoice, args.coin.upper(), args.json)
    if args.json:
        emit_json(quote)
    return OK


def cmd_invoices(api: Api, args) -> int:
    return listing(api, args, "invoices", [("id", "ID"), ("kind", "KIND"), ("state", "STATE"), ("lease", "LEASE"),
                                            ("amount_usd", "USD"), ("created_at", "CREATED"), ("paid_at", "PAID")],
                    params={"state": args.state} if args.state else None)


def cmd_pay(api: Api, args) -> int:
    invoice = api.post(f"invoices/{args.invoice}/pay")
    return reply(args, invoice, f"Invoice #{invoice['id']}: ${invoice['amount_usd']} paid from the balance.")


def cmd_top_up(api: Api, args) -> int:
    invoice = api.post("account/top-up", {"amount_usd": args.amount})
    quote = _print_invoice(api, invoice, args.coin.upper() if args.coin else None, args.json)
    if args.json:
        emit_json({"invoice": invoice, "quote": quote})
    return OK


def cmd_confirm_late(api: Api, args) -> int:
    invoice = api.post(f"quotes/{args.quote}/confirm-late")
    return reply(args, invoice, f"Paid from your balance: invoice #{invoice['id']}.")
