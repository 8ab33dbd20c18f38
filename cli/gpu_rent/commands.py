"""One function per command: call the API, print JSON (--json) or text, return the exit code."""
import getpass
import os
import re
import shutil
import sys
import time

from . import config, transfer
from .client import Api
from .errors import LEASE_ENDED, NOT_FOUND, OK, REFUSED, USAGE, WAIT_TIMEOUT, CliError
from .output import emit_json, fields, progress, table

LEASE_COLUMNS = [("id", "ID"), ("state", "STATE"), ("offer", "OFFER"), ("site", "SITE"), ("term", "TERM"),
                 ("price_usd", "USD/TERM"), ("ends_at", "ENDS (UTC)"), ("auto_renew", "AUTO-RENEW"), ("ssh", "SSH")]
ENDED = ("cancelled", "failed", "released", "wiped")


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(text).lower())


# --- account ------------------------------------------------------------------------------

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


# --- offers and the calculator ------------------------------------------------------------

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


# --- ordering -----------------------------------------------------------------------------

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


# --- leases -------------------------------------------------------------------------------

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


# --- keys, storage, invoices --------------------------------------------------------------

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


def _listing(api: Api, args, path: str, columns, params=None, key: str | None = None) -> int:
    key = key or path
    rows = api.get(path, params=params)[key]
    if args.json:
        emit_json({key: rows})
    else:
        table(rows, columns)
    return OK


VOLUME_COLUMNS = [("id", "ID"), ("name", "NAME"), ("site", "SITE"), ("size_tb", "TB"), ("state", "STATE"),
                  ("paid_until", "PAID UNTIL"), ("attached_to", "ATTACHED TO")]
SNAPSHOT_COLUMNS = [("id", "ID"), ("lease", "LEASE"), ("region", "REGION"), ("size_tb", "TB"), ("state", "STATE"),
                    ("paid_until", "PAID UNTIL")]


def _confirm(args, question: str) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CliError(USAGE, "This cannot be undone: add --yes.")
    return input(f"{question} [y/N] ").strip().lower() == "y"


def _done(args, data: dict, text: str) -> int:
    emit_json(data) if args.json else print(text)
    return OK


def cmd_volumes(api: Api, args) -> int:
    action = args.volumes_command or "ls"
    if action == "ls":
        return _listing(api, args, "volumes", VOLUME_COLUMNS)
    if action == "create":
        v = api.post("volumes", {"site": args.site.upper(), "size_tb": args.size_tb, "name": args.name})
        return _done(args, v, f"Volume #{v['id']} {v['name']}: {v['size_tb']} TB at {v['site']}, "
                              f"paid until {v['paid_until']}.")
    if action in ("attach", "detach"):
        v = api.post(f"volumes/{args.volume}/{action}", {"lease": args.lease})
        return _done(args, v, f"Volume #{v['id']} {action}ed: attached to {v['attached_to'] or 'no lease'}.")
    if action == "grow":
        v = api.post(f"volumes/{args.volume}/grow", {"size_tb": args.size_tb})
        return _done(args, v, f"Volume #{v['id']} is now {v['size_tb']} TB.")
    if not _confirm(args, f"Delete volume #{args.volume} and its data?"):
        return USAGE
    return _done(args, api.delete(f"volumes/{args.volume}"), f"Volume #{args.volume} deleted.")


def cmd_snapshots(api: Api, args) -> int:
    action = args.snapshots_command or "ls"
    if action == "ls":
        return _listing(api, args, "snapshots", SNAPSHOT_COLUMNS)
    if action == "take":
        snap = api.post("snapshots", {"lease": args.lease, "size_tb": args.size_tb})
        return _done(args, snap, f"Snapshot #{snap['id']} of lease #{snap['lease']}: {snap['state']}.")
    if action == "restore":     # the same action as `gpu-rent restore LEASE SNAPSHOT`
        return cmd_restore(api, args)
    if not _confirm(args, f"Delete snapshot #{args.snapshot}?"):
        return USAGE
    return _done(args, api.delete(f"snapshots/{args.snapshot}"), f"Snapshot #{args.snapshot} deleted.")


def cmd_restore(api: Api, args) -> int:
    """A snapshot kept in a repository into a stopped lease's disk (the lease page's Restore)."""
    done = api.post(f"leases/{args.lease}/restore", {"snapshot": args.snapshot})
    return _done(args, done, done.get("message") or f"Lease #{args.lease}: restore requested.")


def _secret(args, pair: dict) -> int:
    return _done(args, pair, f"endpoint   {pair['endpoint'] or '-'}\naccess key {pair['access_key']}\n"
                             f"secret key {pair['secret_key']}\n(the secret is shown this once)")


def cmd_s3(api: Api, args) -> int:
    action = args.s3_command or "ls"
    if action == "ls":
        accounts = api.get("object-storage")["accounts"]
        if args.json:
            emit_json({"accounts": accounts})
        else:
            table([{**a, "keys": " ".join(f"{k['id']}:{k['access_key']}" for k in a["keys"])} for a in accounts],
                  [("id", "ID"), ("site", "SITE"), ("quota_gb", "QUOTA GB"), ("endpoint", "ENDPOINT"),
                   ("keys", "KEYS (ID:ACCESS KEY)")])
        return OK
    if action == "open":
        a = api.post("object-storage", {"site": args.site.upper(), "quota_gb": args.quota_gb})
        return _done(args, a, f"Object storage #{a['id']} at {a['site']}: quota {a['quota_gb']} GB. "
                              f"Make a key: gpu-rent s3 key-new {a['id']}")
    if action == "key-new":
        return _secret(args, api.post(f"object-storage/{args.account}/keys"))
    if action == "key-rotate":
        return _secret(args, api.post(f"object-storage/keys/{args.key}/rotate"))
    done = api.delete(f"object-storage/keys/{args.key}")
    return _done(args, done, f"Key {done['access_key']} revoked: it no longer works.")


def cmd_quote(api: Api, args) -> int:
    invoice = api.get(f"invoices/{args.invoice}")
    if invoice["state"] != "open":
        raise CliError(REFUSED, f"Invoice #{args.invoice} is {invoice['state']}: there is nothing to pay.")
    quote = _print_invoice(api, invoice, args.coin.upper(), args.json)
    if args.json:
        emit_json(quote)
    return OK


def cmd_sites(api: Api, args) -> int:
    rows = api.get("sites", auth=False)["sites"]
    emit_json({"sites": rows}) if args.json else table(rows, [("code", "SITE"), ("name", "CITY"),
                                                              ("region", "REGION")])
    return OK


def cmd_images(api: Api, args) -> int:
    rows = api.get("images", auth=False)["images"]
    emit_json({"images": rows}) if args.json else table(rows, [("slug", "IMAGE"), ("vendor", "VENDOR"),
                                                               ("name", "NAME")])
    return OK


def cmd_invoices(api: Api, args) -> int:
    return _listing(api, args, "invoices", [("id", "ID"), ("kind", "KIND"), ("state", "STATE"), ("lease", "LEASE"),
                                            ("amount_usd", "USD"), ("created_at", "CREATED"), ("paid_at", "PAID")],
                    params={"state": args.state} if args.state else None)


def cmd_pay(api: Api, args) -> int:
    invoice = api.post(f"invoices/{args.invoice}/pay")
    return _done(args, invoice, f"Invoice #{invoice['id']}: ${invoice['amount_usd']} paid from the balance.")


def cmd_top_up(api: Api, args) -> int:
    invoice = api.post("account/top-up", {"amount_usd": args.amount})
    quote = _print_invoice(api, invoice, args.coin.upper() if args.coin else None, args.json)
    if args.json:
        emit_json({"invoice": invoice, "quote": quote})
    return OK


def cmd_sla(api: Api, args) -> int:
    if (args.sla_command or "ls") == "ls":
        return _listing(api, args, "sla-claims", [("id", "ID"), ("lease", "LEASE"), ("period", "MONTH"),
                                                  ("state", "STATE"), ("availability_pct", "AVAILABILITY %"),
                                                  ("credit_usd", "CREDIT USD")], key="claims")
    claim = api.post("sla-claims", {"lease": args.lease, "period": args.month, "message": args.message})
    return _done(args, claim, f"Claim #{claim['id']} filed: computed credit ${claim['credit_usd']} "
                              f"(availability {claim['availability_pct']} %). An operator will decide.")


def cmd_webhook(api: Api, args) -> int:
    action = args.webhook_command or "show"
    if action in ("show", "set", "rotate"):
        hook = {"show": lambda: api.get("webhook"), "set": lambda: api.post("webhook", {"url": args.url}),
                "rotate": lambda: api.post("webhook/rotate")}[action]()
        if args.json:
            emit_json(hook)
            return OK
        print(f"{hook['url']} ({'active' if hook['active'] else 'inactive'})")
        if hook.get("secret"):
            print(f"secret {hook['secret']}  (shown this once: keep it to check the signatures)")
        table(hook["deliveries"], [("id", "ID"), ("event", "EVENT"), ("state", "STATE"), ("attempts", "TRIES"),
                                   ("last_status", "HTTP"), ("created_at", "CREATED")])
        return OK
    if action == "rm":
        return _done(args, api.delete("webhook"), "Webhook removed: no more events are sent.")
    if action == "test":
        done = api.post("webhook/test")
        return _done(args, done, done["message"])
    done = api.post(f"webhook/deliveries/{args.delivery}/redeliver")
    return _done(args, done, f"{done['message']} ({done['delivery_id']})")


def cmd_confirm_late(api: Api, args) -> int:
    invoice = api.post(f"quotes/{args.quote}/confirm-late")
    return _done(args, invoice, f"Paid from your balance: invoice #{invoice['id']}.")


def cmd_cp(api: Api, args) -> int:
    """Files to and from a lease's instance over its SSH, resumable (transfer.py)."""
    return transfer.run(api, args)


# --- the workbench: a lease's image, variables, secrets and ports -------------------------------

def looks_like_image_ref(text: str) -> bool:
    """`--image` names a registry image when it has a registry, a path, a tag or a digest
    (ubuntu:24.04, pytorch/pytorch, ghcr.io/org/x@sha256:…); a bare word is a template's slug."""
    return any(c in text for c in "/:@")


def _assignments(items: list[str], *, secret: bool) -> dict:
    """NAME=value pairs; for a secret, a bare NAME takes the value of that environment
    variable, so it never appears on the command line (shell history, `ps`)."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq:
            if not secret:
                raise CliError(USAGE, f"Give {item!r} as NAME=value.")
            if name not in os.environ:
                raise CliError(USAGE, f"--secret {name}: set the environment variable {name} to its value, "
                               f"or give {name}=value.")
            value = os.environ[name]
        out[name] = value
    return out


def _port_specs(items: list[str]) -> list[dict]:
    """8888 or 8888:203.0.113.0/24,2001:db8::/32 → {"port", "allow"} (checked by the server)."""
    out = []
    for item in items:
        port, _colon, allow = item.partition(":")
        if not port.isdigit():
            raise CliError(USAGE, f"Give a port as PORT or PORT:CIDR,CIDR, not {item!r}.")
        out.append({"port": int(port), "allow": [a for a in allow.split(",") if a]})
    return out


def workbench_order_fields(args) -> dict:
    body = {}
    if getattr(args, "registry_credential", None):
        body["registry_credential"] = args.registry_credential
    if getattr(args, "start_command", None) is not None:
        body["start_command"] = args.start_command
    if getattr(args, "env", None):
        body["env"] = _assignments(args.env, secret=False)
    if getattr(args, "secret", None):
        body["secrets"] = _assignments(args.secret, secret=True)
    if getattr(args, "port", None):
        body["ports"] = _port_specs(args.port)
    return body


def _workbench_text(wb: dict) -> None:
    print(f"image    {wb['image_ref'] or wb['image']}"
          + (f" (credential {wb['registry_credential']})" if wb.get("registry_credential") else ""))
    if wb.get("pull"):
        pull = wb["pull"]
        print(f"pulling  {pull['done_bytes']} of {pull['total_bytes'] or '?'} bytes")
    if wb.get("error"):
        print(f"error    {wb['error']['code']}: {wb['error'].get('text') or wb['error'].get('detail', '')}")
    if wb.get("start_command"):
        print(f"command  {wb['start_command']}")
    for name, value in sorted(wb["env"].items()):
        print(f"env      {name}={value}")
    for name in wb["secret_names"]:
        print(f"secret   {name} (value hidden)")
    for port in wb["ports"]:
        address = (wb.get("addresses") or {}).get(str(port["port"]), "not published yet")
        print(f"port     {port['port']} -> {address}  from {', '.join(port['allow'])}")


def _workbench_change(api: Api, args, body: dict) -> int:
    wb = api.patch(f"leases/{args.lease}/workbench", body)
    if args.json:
        emit_json(wb)
    else:
        print(("Changed " + ", ".join(wb["changed"]) + ": the server recreates the container within a minute "
               "(files on the disk are kept).") if wb["changed"] else "Nothing changed.")
    return OK


def cmd_workbench(api: Api, args) -> int:
    """The lease's image, command, variables, secrets (by name) and ports with their addresses."""
    wb = api.get(f"leases/{args.lease}/workbench")
    emit_json(wb) if args.json else _workbench_text(wb)
    return OK


def cmd_env(api: Api, args) -> int:
    if args.env_command == "ls":
        return cmd_workbench(api, args)
    if args.env_command == "set":
        return _workbench_change(api, args, {"env": _assignments(args.pairs, secret=False)})
    if args.env_command == "command":
        return _workbench_change(api, args, {"start_command": args.start_command})
    return _workbench_change(api, args, {"env": {name: None for name in args.names}})


def cmd_secrets(api: Api, args) -> int:
    if args.secrets_command == "ls":
        wb = api.get(f"leases/{args.lease}/workbench")
        emit_json({"secret_names": wb["secret_names"]}) if args.json else print("\n".join(wb["secret_names"]))
        return OK
    if args.secrets_command == "set":
        return _workbench_change(api, args, {"secrets": _assignments(args.pairs, secret=True)})
    return _workbench_change(api, args, {"secrets": {name: None for name in args.names}})


def cmd_ports(api: Api, args) -> int:
    if args.ports_command == "ls":
        return cmd_workbench(api, args)
    current = api.get(f"leases/{args.lease}/workbench")["ports"]
    if args.ports_command == "set":
        ports = _port_specs(args.specs)
    elif args.ports_command == "add":
        added = _port_specs(args.specs)
        ports = [p for p in current if p["port"] not in {a["port"] for a in added}] + added
    else:
        ports = [p for p in current if p["port"] not in set(args.ports)]
    return _workbench_change(api, args, {"ports": ports})


# --- the account's registry credentials and variables ----------------------------------------

def cmd_registry(api: Api, args) -> int:
    if args.registry_command in (None, "ls"):
        return _listing(api, args, "registry-credentials", [("id", "ID"), ("name", "NAME"), ("server", "REGISTRY"),
                                                            ("username", "USER"), ("updated_at", "UPDATED")],
                        key="registry_credentials")
    if args.registry_command == "add":
        if args.password_stdin or not sys.stdin.isatty():
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = getpass.getpass(f"Password or token for {args.username}@{args.server}: ")
        row = api.post("registry-credentials", {"name": args.name, "server": args.server, "username": args.username,
                                                "password": password})
        return _done(args, row, f"Saved registry credential {row['name']} ({row['username']}@{row['server']}).")
    rows = api.get("registry-credentials")["registry_credentials"]
    match = [r for r in rows if r["name"] == args.credential or str(r["id"]) == args.credential]
    if not match:
        raise CliError(NOT_FOUND, f"No registry credential {args.credential!r}; see `gpu-rent registry ls`.")
    return _done(args, api.delete(f"registry-credentials/{match[0]['id']}"),
                 f"Deleted registry credential {match[0]['name']}.")


def cmd_vars(api: Api, args) -> int:
    if args.vars_command in (None, "ls"):
        rows = api.get("account/variables")["variables"]
        if args.json:
            emit_json({"variables": rows})
        else:
            table([{**r, "value": "(secret, hidden)" if r["secret"] else r["value"]} for r in rows],
                  [("name", "NAME"), ("value", "VALUE"), ("updated_at", "UPDATED")])
        return OK
    if args.vars_command == "set":
        values = _assignments([args.pair], secret=args.secret)
        (name, value), = values.items()
        row = api.post("account/variables", {"name": name, "value": value, "secret": args.secret})
        return _done(args, row, f"Saved {row['name']}{' (secret)' if row['secret'] else ''}: leases you order "
                                "from now on get it.")
    return _done(args, api.delete(f"account/variables/{args.name}"), f"Deleted {args.name}.")


# --- the team (members with roles) ---------------------------------------------------------

MEMBER_COLUMNS = [("id", "ID"), ("username", "MEMBER"), ("role", "ROLE"), ("since", "SINCE (UTC)")]


def _member_id(api: Api, who: str) -> int:
    members = api.get("team")["members"]
    match = [m for m in members if m["username"] == who or str(m["id"]) == who]
    if not match:
        raise CliError(NOT_FOUND, f"No member {who!r} in this team.")
    return match[0]["id"]


def cmd_team(api: Api, args) -> int:
    action = {"list": "ls", "remove": "rm"}.get(args.team_command, args.team_command or "ls")
    if action == "ls":
        team = api.get("team")
        if args.json:
            emit_json(team)
            return OK
        print(f"Account {team['account']} · you: {team['you']['username']} ({team['you']['role']})")
        table(team["members"], MEMBER_COLUMNS)
        if team.get("invitations"):
            print("\nPending invitations:")
            table(team["invitations"], [("id", "ID"), ("email", "E-MAIL"), ("role", "ROLE"), ("expires_at", "EXPIRES")])
        return OK
    if action == "invite":
        made = api.post("team", {"email": args.email, "role": args.role})
        link = api.base + made["link"]
        return _done(args, {**made, "link": link},
                     f"Invited {made['email']} as {made['role']} (mailed too). The link works once, "
                     f"until {made['expires_at']}; it is shown only now:\n{link}")
    if action == "withdraw":
        return _done(args, api.delete(f"team/invitations/{args.invitation}"),
                     f"Invitation #{args.invitation} withdrawn.")
    member_id = _member_id(api, args.member)
    if action == "role":
        changed = api.patch(f"team/members/{member_id}", {"role": args.role})
        return _done(args, changed, f"{changed['username']} is now {changed['role']}.")
    return _done(args, api.delete(f"team/members/{member_id}"), f"Removed {args.member} from the team.")



METRIC_COLUMNS = [("at", "TIME (UTC)"), ("gpu", "GPU"), ("util", "UTIL%"), ("vram", "VRAM GiB"), ("temp_c", "TEMP C"),
                  ("power_w", "POWER W"), ("sm_mhz", "SM MHz")]


def _figure(value, digits: int = 0):
    return None if value is None else f"{value:.{digits}f}"


def cmd_metrics(api: Api, args) -> int:
    """GET /api/v1/leases/<id>/metrics as a table: one row per step and GPU (the mean of the
    minutes in it), then the term's egress and the GPU errors."""
    params = {"since": args.since}
    if args.until:
        params["until"] = args.until
    if args.resolution or not args.json:
        params["resolution"] = str(args.resolution or 60)
    data = api.get(f"leases/{args.lease}/metrics", params=params)
    if args.json:
        emit_json(data)
        return OK
    columns = data["columns"]
    rows = []
    for card in data["gpus"]:
        for point in card["points"]:
            values = dict(zip(columns, point, strict=False))
            rows.append({"at": values["at"][:16].replace("T", " "), "gpu": card["gpu"],
                         "util": _figure(values.get("util")),
                         "vram": _figure(None if values.get("mem_mb") is None else values["mem_mb"] / 1024, 1),
                         "temp_c": _figure(values.get("temp_c")), "power_w": _figure(values.get("power_w")),
                         "sm_mhz": _figure(values.get("sm_mhz"))})
    rows.sort(key=lambda r: (r["at"], r["gpu"]))
    if rows:
        table(rows, METRIC_COLUMNS)
    else:
        print(f"No GPU readings for lease #{args.lease} from {data['since']} to {data['until']}.")
    egress = data.get("egress")
    if egress:
        print(f"egress this term (since {egress['term_start'][:16].replace('T', ' ')} UTC): "
              f"{egress['tb_used']} TB of {egress['included_tb']} TB included"
              + (f", {egress['over_tb']} TB over" if egress["over_tb"] not in ("0", "0.000", "0.00") else ""))
    for event in data.get("events", []):
        what = (f"Xid {event['xid']}" + (f" x{event['count']}" if event.get("count", 1) > 1 else "")
                if event["kind"] == "xid" else
                f"ECC {event['corrected']} corrected, {event['uncorrected']} uncorrected")
        print(f"  {event['at'][:16].replace('T', ' ')}  GPU {event['gpu']}  {what}")
    return OK
