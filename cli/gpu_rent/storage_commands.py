"""The storage commands: network volumes, snapshots (and restoring one onto a lease), object storage."""
from .client import Api
from .errors import OK, USAGE
from .output import confirmed, emit_json, listing, reply, table

VOLUME_COLUMNS = [("id", "ID"), ("name", "NAME"), ("site", "SITE"), ("size_tb", "TB"), ("state", "STATE"),
                  ("paid_until", "PAID UNTIL"), ("attached_to", "ATTACHED TO")]


SNAPSHOT_COLUMNS = [("id", "ID"), ("lease", "LEASE"), ("region", "REGION"), ("size_tb", "TB"), ("state", "STATE"),
                    ("paid_until", "PAID UNTIL")]


def cmd_volumes(api: Api, args) -> int:
    action = args.volumes_command or "ls"
    if action == "ls":
        return listing(api, args, "volumes", VOLUME_COLUMNS)
    if action == "create":
        v = api.post("volumes", {"site": args.site.upper(), "size_tb": args.size_tb, "name": args.name})
        return reply(args, v, f"Volume #{v['id']} {v['name']}: {v['size_tb']} TB at {v['site']}, "
                              f"paid until {v['paid_until']}.")
    if action in ("attach", "detach"):
        v = api.post(f"volumes/{args.volume}/{action}", {"lease": args.lease})
        return reply(args, v, f"Volume #{v['id']} {action}ed: attached to {v['attached_to'] or 'no lease'}.")
    if action == "grow":
        v = api.post(f"volumes/{args.volume}/grow", {"size_tb": args.size_tb})
        return reply(args, v, f"Volume #{v['id']} is now {v['size_tb']} TB.")
    if not confirmed(args, f"Delete volume #{args.volume} and its data?"):
        return USAGE
    return reply(args, api.delete(f"volumes/{args.volume}"), f"Volume #{args.volume} deleted.")


def cmd_snapshots(api: Api, args) -> int:
    action = args.snapshots_command or "ls"
    if action == "ls":
        return listing(api, args, "snapshots", SNAPSHOT_COLUMNS)
    if action == "take":
        snap = api.post("snapshots", {"lease": args.lease, "size_tb": args.size_tb})
        return reply(args, snap, f"Snapshot #{snap['id']} of lease #{snap['lease']}: {snap['state']}.")
    if action == "restore":     # the same action as `gpu-rent restore LEASE SNAPSHOT`
        return cmd_restore(api, args)
    if not confirmed(args, f"Delete snapshot #{args.snapshot}?"):
        return USAGE
    return reply(args, api.delete(f"snapshots/{args.snapshot}"), f"Snapshot #{args.snapshot} deleted.")


def cmd_restore(api: Api, args) -> int:
    """A snapshot kept in a repository into a stopped lease's disk (the lease page's Restore)."""
    done = api.post(f"leases/{args.lease}/restore", {"snapshot": args.snapshot})
    return reply(args, done, done.get("message") or f"Lease #{args.lease}: restore requested.")


def _secret(args, pair: dict) -> int:
    return reply(args, pair, f"endpoint   {pair['endpoint'] or '-'}\naccess key {pair['access_key']}\n"
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
        return reply(args, a, f"Object storage #{a['id']} at {a['site']}: quota {a['quota_gb']} GB. "
                              f"Make a key: gpu-rent s3 key-new {a['id']}")
    if action == "key-new":
        return _secret(args, api.post(f"object-storage/{args.account}/keys"))
    if action == "key-rotate":
        return _secret(args, api.post(f"object-storage/keys/{args.key}/rotate"))
    done = api.delete(f"object-storage/keys/{args.key}")
    return reply(args, done, f"Key {done['access_key']} revoked: it no longer works.")
