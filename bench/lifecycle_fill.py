"""bench/lifecycle.py's bulk fill (INSERT … SELECT over generate_series on PostgreSQL): the
history, and the due leases of the due-work case.

Every INSERT names the columns it means and gets every other NOT NULL column from the
model's own default (`insert_select`), so a column added later (billing_invoice.flag broke
the old fill) fills itself instead of failing the benchmark; a new required column without
a default fails it loudly, naming the column."""
from django.db import connection

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P bench@host"
LEASE_COLUMNS = ("customer_id", "offer_id", "site_id", "image_id", "term", "state", "price_cents", "ssh_public_key",
                 "created_at", "pay_by", "provisioning_started_at", "started_at", "ends_at", "suspended_at",
                 "hold_until", "wipe_by", "ended_at", "host", "ssh_port")

# One row per lease; `live` rows first (ids 1..ACTIVE+SUSPENDED), the rest history.
HISTORY_LEASES = """
SELECT c.customer, c.offer, c.site, c.image, 'week', s.state, 6500, %(key)s,
       s.created, s.created + interval '30 minutes',
       CASE WHEN s.state = 'cancelled' THEN NULL ELSE s.created END,
       CASE WHEN s.state = 'cancelled' THEN NULL ELSE s.ends - interval '7 days' END,
       CASE WHEN s.state = 'cancelled' THEN NULL ELSE s.ends END,
       CASE WHEN s.state IN ('suspended', 'wiped') THEN s.ends END,
       CASE WHEN s.state = 'suspended' THEN %(now)s + interval '1 hour' + (g %% 4000) * interval '1 minute'
            WHEN s.state = 'wiped' THEN s.ends + interval '72 hours' END,
       CASE WHEN s.state = 'active' THEN NULL WHEN s.state = 'cancelled' THEN s.created + interval '30 minutes'
            ELSE s.ends + interval '7 days' END,
       CASE WHEN s.state = 'wiped' THEN s.ends + interval '72 hours'
            WHEN s.state = 'cancelled' THEN s.created + interval '30 minutes' END,
       CASE WHEN s.state IN ('active', 'suspended') THEN 'bench.local' ELSE '' END,
       CASE WHEN s.state IN ('active', 'suspended') THEN 22000 END
FROM generate_series(1, %(total)s) AS g
CROSS JOIN LATERAL (SELECT
    CASE WHEN g <= %(active)s THEN 'active' WHEN g <= %(active)s + %(suspended)s THEN 'suspended'
         WHEN g %% 10 = 0 THEN 'cancelled' ELSE 'wiped' END AS state,
    CASE WHEN g <= %(active)s THEN %(now)s + interval '4 days' + (g %% 26) * interval '1 day'
         WHEN g <= %(active)s + %(suspended)s THEN %(now)s - interval '1 day'
         ELSE %(now)s - interval '12 days' - (g %% 700) * interval '1 day' END AS ends,
    %(now)s - interval '8 days' - (g %% 730) * interval '1 day' AS created) AS s
CROSS JOIN LATERAL (SELECT
    (%(customers)s)[1 + g %% array_length(%(customers)s, 1)] AS customer,
    (%(offers)s)[1 + g %% array_length(%(offers)s, 1)] AS offer,
    (%(sites)s)[1 + g %% array_length(%(sites)s, 1)] AS site, %(image)s AS image) AS c
"""

# The due-work case: `due` more leases, each with one piece of work for the next pass, in
# four equal groups by g % 4 — 0 and 1: active, the term ending within the renewal lead
# and the shortest reminder's lead (renewal invoice + reminder; the even customers' balance
# pays it: the lease is extended); 2: active, the term ended minutes ago with its renewal
# invoice open (suspension + notice); 3: suspended, the hold over (release → key destroyed
# → wiped, the renewal voided, the release notice). `due_group(kind)` is lease ids' group.
DUE_LEASES = """
SELECT c.customer, c.offer, c.site, c.image, 'week', s.state, 6500, %(key)s,
       s.ends - interval '8 days', s.ends - interval '8 days', s.ends - interval '7 days',
       s.ends - interval '7 days', s.ends, s.suspended, s.hold, s.wipe, NULL::timestamptz, 'bench.local', 22000
FROM generate_series(1, %(due)s) AS g
CROSS JOIN LATERAL (SELECT
    CASE WHEN g %% 4 = 3 THEN 'suspended' ELSE 'active' END AS state,
    CASE WHEN g %% 4 < 2 THEN %(now)s + interval '1 hour' + (g %% 240) * interval '1 minute'
         WHEN g %% 4 = 2 THEN %(now)s - interval '1 minute' - (g %% 50) * interval '1 second'
         ELSE %(now)s - %(hold)s - interval '1 minute' - (g %% 50) * interval '1 second' END AS ends) AS e
CROSS JOIN LATERAL (SELECT e.state, e.ends,
    CASE WHEN e.state = 'suspended' THEN e.ends END AS suspended,
    CASE WHEN e.state = 'suspended' THEN e.ends + %(hold)s END AS hold,
    CASE WHEN e.state = 'suspended' THEN e.ends + %(wipe)s END AS wipe) AS s
CROSS JOIN LATERAL (SELECT
    (%(customers)s)[1 + g %% array_length(%(customers)s, 1)] AS customer,
    (%(offers)s)[1 + g %% array_length(%(offers)s, 1)] AS offer,
    (%(sites)s)[1 + g %% array_length(%(sites)s, 1)] AS site, %(image)s AS image) AS c
"""
DUE_GROUP = "(id - %(first)s + 1) %% 4"  # the g of DUE_LEASES, from the lease id


def _not_null_defaults(model, given: tuple[str, ...]) -> dict[str, object]:
    """Every NOT NULL column the INSERT does not name, with its model default as the
    database sees it."""
    out = {}
    for field in model._meta.concrete_fields:
        if field.primary_key or field.null or field.column in given:
            continue
        default = field.get_default()
        if default is None:
            raise SystemExit(f"bench fill: {model._meta.db_table}.{field.column} is NOT NULL without a default: "
                             "give it a value in bench/lifecycle_fill.py")
        out[field.column] = field.get_db_prep_save(default, connection)
    return out


def insert_select(model, columns: tuple[str, ...], select: str, params: dict) -> None:
    """INSERT INTO the model's table (columns, every other NOT NULL column) SELECT …, defaults."""
    defaults = _not_null_defaults(model, columns)
    names = ", ".join((*columns, *defaults))
    extra = "".join(f", %(default_{c})s" for c in defaults)
    sql = f"INSERT INTO {model._meta.db_table} ({names}) SELECT q.*{extra} FROM ({select}) AS q"
    with connection.cursor() as cur:
        cur.execute(sql, {**params, **{f"default_{c}": v for c, v in defaults.items()}})


def fill_history(*, now, total, active, suspended, customers, offers, sites, image) -> None:
    from billing.models import Invoice
    from rental.models import DiskKey, Lease, Notification

    insert_select(Lease, LEASE_COLUMNS, HISTORY_LEASES, {
        "key": KEY, "now": now, "total": total, "active": active, "suspended": suspended,
        "customers": customers, "offers": offers, "sites": sites, "image": image})
    insert_select(DiskKey, ("lease_id", "key_ref", "state", "created_at", "destroyed_at"), """
        SELECT id, md5(id::text), CASE WHEN state IN ('active', 'suspended') THEN 'active' ELSE 'destroyed' END,
               created_at, CASE WHEN state IN ('active', 'suspended') THEN NULL ELSE ended_at END
        FROM rental_lease""", {})
    insert_select(Invoice, ("customer_id", "lease_id", "kind", "state", "amount_cents", "created_at", "expires_at",
                            "paid_at", "paid_via"), """
        SELECT customer_id, id, 'order', CASE WHEN state = 'cancelled' THEN 'expired' ELSE 'paid' END, 6500,
               created_at, created_at + interval '30 minutes',
               CASE WHEN state = 'cancelled' THEN NULL ELSE created_at END,
               CASE WHEN state = 'cancelled' THEN '' ELSE 'balance' END
        FROM rental_lease""", {})
    insert_select(Notification, ("lease_id", "customer_id", "kind", "deadline", "created_at", "subject"), """
        SELECT id, customer_id, 'suspended', hold_until, suspended_at, 'suspended' FROM rental_lease
        WHERE state = 'suspended'""", {})


def fill_due(*, now, due, first_id, hold, wipe, customers, offers, sites, image) -> None:
    """`due` leases with ids from first_id (the history's ids end just before)."""
    from billing.models import Invoice, InvoiceLine
    from rental.models import DiskKey, Lease, Notification

    group = DUE_GROUP
    params = {"first": first_id}
    insert_select(Lease, LEASE_COLUMNS, DUE_LEASES, {
        "key": KEY, "now": now, "due": due, "hold": hold, "wipe": wipe, "customers": customers,
        "offers": offers, "sites": sites, "image": image})
    insert_select(DiskKey, ("lease_id", "key_ref", "state", "created_at"),
                  "SELECT id, md5(id::text), 'active', created_at FROM rental_lease WHERE id >= %(first)s", params)
    insert_select(Invoice, ("customer_id", "lease_id", "kind", "state", "amount_cents", "created_at", "paid_at",
                            "paid_via"), """
        SELECT customer_id, id, 'order', 'paid', 6500, created_at, created_at, 'balance' FROM rental_lease
        WHERE id >= %(first)s""", params)
    # Groups 2 and 3: the renewal invoice was issued (open), reminders and notices sent.
    insert_select(Invoice, ("customer_id", "lease_id", "kind", "state", "amount_cents", "created_at", "term_start"),
                  f"""SELECT customer_id, id, 'renewal', 'open', 6500, ends_at - interval '1 day', ends_at
                      FROM rental_lease WHERE id >= %(first)s AND {group} >= 2""", params)
    insert_select(InvoiceLine, ("invoice_id", "description", "quantity", "unit_cents", "amount_cents"), """
        SELECT id, 'renewal', 1, 6500, 6500 FROM billing_invoice WHERE kind = 'renewal'
        AND lease_id >= %(first)s""", params)
    for kind in ("reminder_3d", "reminder_1d", "renewal_invoice"):
        insert_select(Notification, ("lease_id", "customer_id", "kind", "deadline", "created_at", "subject"),
                      f"""SELECT id, customer_id, '{kind}', ends_at, ends_at - interval '1 day', '{kind}'
                          FROM rental_lease WHERE id >= %(first)s AND {group} >= 2""", params)
    insert_select(Notification, ("lease_id", "customer_id", "kind", "deadline", "created_at", "subject"), f"""
        SELECT id, customer_id, 'suspended', hold_until, suspended_at, 'suspended' FROM rental_lease
        WHERE id >= %(first)s AND {group} = 3""", params)
