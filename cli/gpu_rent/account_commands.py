"""The account-wide commands: sites and images, SLA claims, the webhook, the team and a lease's metrics."""

from .client import Api
from .errors import NOT_FOUND, OK, CliError
from .output import emit_json, listing, reply, table


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


def cmd_sla(api: Api, args) -> int:
    if (args.sla_command or "ls") == "ls":
        return listing(api, args, "sla-claims", [("id", "ID"), ("lease", "LEASE"), ("period", "MONTH"),
                                                  ("state", "STATE"), ("availability_pct", "AVAILABILITY %"),
                                                  ("credit_usd", "CREDIT USD")], key="claims")
    claim = api.post("sla-claims", {"lease": args.lease, "period": args.month, "message": args.message})
    return reply(args, claim, f"Claim #{claim['id']} filed: computed credit ${claim['credit_usd']} "
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
        return reply(args, api.delete("webhook"), "Webhook removed: no more events are sent.")
    if action == "test":
        done = api.post("webhook/test")
        return reply(args, done, done["message"])
    done = api.post(f"webhook/deliveries/{args.delivery}/redeliver")
    return reply(args, done, f"{done['message']} ({done['delivery_id']})")


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
        return reply(args, {**made, "link": link},
                     f"Invited {made['email']} as {made['role']} (mailed too). The link works once, "
                     f"until {made['expires_at']}; it is shown only now:\n{link}")
    if action == "withdraw":
        return reply(args, api.delete(f"team/invitations/{args.invitation}"),
                     f"Invitation #{args.invitation} withdrawn.")
    member_id = _member_id(api, args.member)
    if action == "role":
        changed = api.patch(f"team/members/{member_id}", {"role": args.role})
        return reply(args, changed, f"{changed['username']} is now {changed['role']}.")
    return reply(args, api.delete(f"team/members/{member_id}"), f"Removed {args.member} from the team.")


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
