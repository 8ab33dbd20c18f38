"""The OpenAPI 3.1 description of /api/v1, written by hand. Other apps add their paths by
exposing `PATHS` (and optionally `SCHEMAS`) in `<app>.api_schema`; sizing's estimate
endpoint is merged in this way when that module exists."""
import copy
from importlib import import_module

from .models import ADDON_LIMITS_TB, RETIRED_ADDONS


def iso(value) -> str | None:
    """A moment in the API's and the webhooks' JSON (ISO 8601, UTC), or null."""
    return value.isoformat() if value else None


API_APPS_WITH_PATHS = ("sizing", "fleet")


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict:
    text = {400: "Invalid JSON or fields (the `fields` object names them)", 401: "Missing or invalid token",
            403: "The token lacks the route's scope (read; order; manage for instance actions and auto-renew; "
                 "pay for paying from the balance and refunds): docs/API.md lists them",
            402: "Balance does not cover the order (nothing was created)", 404: "Not found, or not yours",
            405: "Method not allowed", 409: "Sold out, too many unpaid orders, or refund refused (window or monthly limit)", 413: "Body over 64 KB",
            429: "Over a rate limit, per address or per token (Retry-After says when to try again)"}
    return {str(code): _json(_ref("Error"), text[code]) for code in (*codes, 429)}


ID_PARAM = {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}
SECURED = [{"bearer": []}]
MONEY = {"type": "string", "pattern": r"^-?\d+\.\d{2}$", "description": "USD, two decimals"}
STAMP = {"type": ["string", "null"], "format": "date-time"}

SCHEMAS = {
    "Error": {"type": "object", "required": ["error", "message"], "properties": {
        "error": {"type": "string", "examples": ["sold_out", "invalid", "unauthorized"]},
        "message": {"type": "string"},
        "fields": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}}}},
    "Offer": {"type": "object", "properties": {
        "slug": {"type": "string"}, "name": {"type": "string"}, "gpu": {"type": "string"},
        "vendor": {"enum": ["nvidia", "amd"]}, "gpus": {"type": "integer"}, "vram_gb": {"type": "integer"},
        "link": {"type": "string"}, "weekly_cents": {"type": "integer"}, "weekly_usd": MONEY,
        "monthly_cents": {"type": "integer"}, "monthly_usd": MONEY, "per_gpu_hour_cents": {"type": "integer"},
        "per_gpu_hour_usd": MONEY, "free_total": {"type": "integer"},
        "free_by_site": {"type": "object", "additionalProperties": {"type": "integer"}}}},
    "Addons": {"type": "object", "additionalProperties": False, "properties": {
        **{name: {"type": "integer", "minimum": 0, "maximum": limit} for name, limit in ADDON_LIMITS_TB.items()},
        **{name: {"type": "integer", "const": 0, "deprecated": True,
                  "description": "Retired: only 0 is accepted (400 otherwise); snapshots are taken from a running lease"}
           for name in RETIRED_ADDONS}}},
    "LeaseAddons": {"type": "object", "properties": {
        **{name: {"type": "integer", "minimum": 0} for name in ADDON_LIMITS_TB},
        **{name: {"type": "integer", "minimum": 0, "deprecated": True, "readOnly": True,
                  "description": "Retired add-on: what an old lease ordered; new leases show 0"}
           for name in RETIRED_ADDONS}}},
    "OrderRequest": {"type": "object", "required": ["offer", "site", "term", "ssh_key"], "properties": {
        "offer": {"type": "string"}, "site": {"type": "string", "examples": ["DFW-1"]},
        "term": {"enum": ["week", "month"]}, "addons": _ref("Addons"),
        "image": {"type": "string", "description": "Image slug; default: the vendor's PyTorch image"},
        "ssh_key": {"type": "string", "description": "ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa ≥ 2048 bits"},
        "pay_from_balance": {"type": "boolean", "default": False},
        "coin": {"type": "string", "examples": ["LTC"],
                 "description": "Also quote the invoice in this coin (the reply's `quote`). Checked before "
                                "anything is created; a refused coin or quote orders nothing"}}},
    "Lease": {"type": "object", "properties": {
        "id": {"type": "integer"},
        "state": {"enum": ["pending", "provisioning", "active", "suspended", "released", "wiped", "cancelled", "failed"]},
        "offer": {"type": "string"}, "site": {"type": "string"}, "image": {"type": "string"},
        "term": {"enum": ["week", "month"]}, "price_cents": {"type": "integer"}, "price_usd": MONEY,
        "addons": _ref("LeaseAddons"), "created_at": STAMP, "pay_by": STAMP, "started_at": STAMP, "ends_at": STAMP,
        "renewal_invoice_at": STAMP, "refund_until": STAMP, "suspended_at": STAMP, "hold_until": STAMP,
        "wipe_by": STAMP, "ended_at": STAMP,
        "ssh": {"type": ["object", "null"], "properties": {
            "host": {"type": "string"}, "port": {"type": "integer"}, "command": {"type": "string"}}},
        "url": {"type": "string"},
        "node_key_fingerprints": {"type": "array", "items": {"type": "string"}, "description":
                                  "One lease's detail only: the fingerprints (SHA256:…) of the keys that sign "
                                  "the records of the servers it ran on, the current one last; keep them to check "
                                  "the sanitization record with `gpu-rent verify-record`"},
        "events": {"type": "array", "items": {"type": "object"}}}},
    "Invoice": {"type": "object", "properties": {
        "id": {"type": "integer"}, "kind": {"enum": ["order", "renewal", "topup"]},
        "state": {"enum": ["open", "paid", "expired", "void"]}, "lease": {"type": ["integer", "null"]},
        "amount_cents": {"type": "integer"}, "amount_usd": MONEY, "created_at": STAMP, "expires_at": STAMP,
        "paid_at": STAMP, "paid_via": {"type": ["string", "null"]}, "term_start": STAMP, "url": {"type": "string"},
        "lines": {"type": "array", "items": {"type": "object", "properties": {
            "description": {"type": "string"}, "quantity": {"type": "integer"},
            "unit_cents": {"type": "integer"}, "amount_cents": {"type": "integer"}}}}}},
}

PATHS = {
    "/api/v1/offers": {"get": {
        "operationId": "listOffers", "summary": "Offers with prices and free units per site", "security": [],
        "responses": {"200": _json({"type": "object", "properties": {
            "offers": {"type": "array", "items": _ref("Offer")}}}, "The catalog")}}},
    "/api/v1/orders": {"post": {
        "operationId": "placeOrder", "summary": "Place an order: a pending lease holding its GPUs, and its invoice",
        "security": SECURED,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("OrderRequest")}}},
        "responses": {"201": _json({"type": "object", "properties": {
            "lease": _ref("Lease"), "invoice": _ref("Invoice"),
            "quote": {"description": "With `coin`: the quote (null when paid from the balance)"}}}, "Order placed"),
            **_errors(400, 401, 402, 403, 405, 409, 413)}}},
    "/api/v1/leases": {"get": {
        "operationId": "listLeases", "summary": "Your leases, newest first", "security": SECURED,
        "responses": {"200": _json({"type": "object", "properties": {
            "leases": {"type": "array", "items": _ref("Lease")}}}, "Your leases"), **_errors(401)}}},
    "/api/v1/leases/{id}": {"get": {
        "operationId": "getLease", "summary": "One lease with its events", "security": SECURED,
        "parameters": [ID_PARAM],
        "responses": {"200": _json(_ref("Lease"), "The lease"), **_errors(401, 404)}}},
    "/api/v1/leases/{id}/refund": {"post": {
        "operationId": "refundLease", "summary": "Refund before the lease's refund_until: cancelled, money to balance",
        "security": SECURED, "parameters": [ID_PARAM],
        "responses": {"200": _json({"type": "object", "properties": {
            "refunded_cents": {"type": "integer"}, "refunded_usd": MONEY, "lease": _ref("Lease")}}, "Refunded"),
            **_errors(401, 403, 404, 409)}}},
    "/api/v1/leases/{id}/sanitization-record": {"get": {
        "operationId": "getSanitizationRecord",
        "summary": "The node-signed proofs that the lease's disk key was destroyed and the disk wiped, and "
                   "the same for each copy a move left on another node (check offline: gpu-node-agent "
                   "verify-record FILE --node-key KEY)",
        "security": SECURED, "parameters": [ID_PARAM],
        "responses": {"200": _json({"type": "object", "properties": {
            "format": {"type": "string"}, "lease_id": {"type": "integer"},
            "covers": {"type": "object", "description": "what the encrypted disk held and what it did not "
                                                        "(the storefront's statement, not signed)"},
            "proofs": {"type": "array", "items": {"type": "object", "properties": {
                "kind": {"type": "string"}, "node": {"type": "string"},
                "disk": {"type": "string", "enum": ["lease", "moved_copy"]}, "public_key": {"type": "string"},
                "signed": {"type": "string"}, "signature": {"type": "string"}}}}}},
            "The record"), **_errors(401, 404)}}},
    "/api/v1/invoices/{id}": {"get": {
        "operationId": "getInvoice", "summary": "One invoice with its lines", "security": SECURED,
        "parameters": [ID_PARAM],
        "responses": {"200": _json(_ref("Invoice"), "The invoice"), **_errors(401, 404)}}},
    "/api/v1/schema": {"get": {
        "operationId": "getSchema", "summary": "This document", "security": [],
        "responses": {"200": {"description": "OpenAPI 3.1 document"}}}},
}


# --- The endpoints the command-line client (cli/) uses -------------------------------
SCHEMAS["Lease"]["properties"].update({
    "auto_renew": {"type": "boolean", "description": "Whether the renewal is paid from the balance"},
    "auto_renew_setting": {"type": ["boolean", "null"], "description": "This lease's choice; null: the account's"}})
SCHEMAS.update({
    "SshKey": {"type": "object", "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "fingerprint": {"type": "string"},
        "public_key": {"type": "string"}, "created_at": STAMP}},
    "Quote": {"type": "object", "properties": {
        "id": {"type": "integer"}, "invoice": {"type": "integer"}, "coin": {"type": "string"},
        "address": {"type": "string"}, "amount": {"type": "string", "description": "Exact, in the coin"},
        "amount_base_units": {"type": "string"}, "uri": {"type": "string"}, "state": {"type": "string"},
        "expires_at": STAMP, "page": {"type": "string"}}},
})
_LEASE_AND_INVOICE = {"type": "object", "properties": {"lease": _ref("Lease"), "invoice": _ref("Invoice")}}
KEY_ID_PARAM = {"name": "key_id", "in": "path", "required": True, "schema": {"type": "integer"}}
PATHS.update({
    "/api/v1/account": {"get": {
        "operationId": "getAccount", "summary": "The token's account, its scopes and the balance", "security": SECURED,
        "responses": {"200": _json({"type": "object", "properties": {
            "username": {"type": "string"}, "balance_cents": {"type": "integer"}, "balance_usd": MONEY,
            "token": {"type": "object", "properties": {"name": {"type": "string"}, "prefix": {"type": "string"},
                                                        "scopes": {"type": "array", "items": {"type": "string"}}}}}},
            "The account"), **_errors(401)}}},
    "/api/v1/invoices": {"get": {
        "operationId": "listInvoices", "summary": "Your invoices, newest first", "security": SECURED,
        "parameters": [{"name": "state", "in": "query", "required": False,
                        "schema": {"enum": ["open", "paid", "expired", "void"]}}],
        "responses": {"200": _json({"type": "object", "properties": {
            "invoices": {"type": "array", "items": _ref("Invoice")}}}, "Your invoices"), **_errors(400, 401)}}},
    "/api/v1/invoices/{id}/quote": {"post": {
        "operationId": "quoteInvoice", "summary": "Crypto payment details of an open invoice in one coin",
        "security": SECURED, "parameters": [ID_PARAM],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["coin"], "properties": {"coin": {"type": "string", "examples": ["LTC"]}}}}}},
        "responses": {"201": _json(_ref("Quote"), "The quote (reused while unpaid)"),
                      **_errors(400, 401, 403, 404, 409)}}},
    "/api/v1/leases/{id}/extend": {"post": {
        "operationId": "extendLease",
        "summary": "Pay the next term now: the renewal invoice of the term after the current end (one per term)",
        "security": SECURED, "parameters": [ID_PARAM],
        "requestBody": {"required": False, "content": {"application/json": {"schema": {
            "type": "object", "properties": {"pay_from_balance": {"type": "boolean", "default": False}}}}}},
        "responses": {"201": _json(_LEASE_AND_INVOICE, "The lease and the invoice of its next term"),
                      **_errors(400, 401, 402, 403, 404, 409)}}},
    "/api/v1/leases/{id}/auto-renew": {"post": {
        "operationId": "setLeaseAutoRenew", "summary": "Renew from the balance: true, false or null (the account's)",
        "security": SECURED, "parameters": [ID_PARAM],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["auto_renew"], "properties": {"auto_renew": {"type": ["boolean", "null"]}}}}}},
        "responses": {"200": _json(_ref("Lease"), "The lease"), **_errors(400, 401, 403, 404, 409)}}},
    **{f"/api/v1/leases/{{id}}/{action}": {"post": {
        "operationId": f"{action}Instance", "summary": f"{action.capitalize()} the instance (files kept)",
        "security": SECURED, "parameters": [ID_PARAM],
        "responses": {"202": _json({"type": "object", "properties": {
            "action": {"type": "string"}, "message": {"type": "string"}, "lease": _ref("Lease")}}, "Requested"),
            **_errors(401, 403, 404, 409)}}} for action in ("restart", "stop", "start")},
    "/api/v1/leases/{id}/restore": {"post": {
        "operationId": "restoreSnapshotIntoLease",
        "summary": "Replace the stopped instance's disk with one of your snapshots at the lease's site",
        "security": SECURED, "parameters": [ID_PARAM],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["snapshot"], "properties": {"snapshot": {"type": "integer"}}}}}},
        "responses": {"202": _json({"type": "object", "properties": {
            "action": {"type": "string"}, "snapshot": {"type": "integer"}, "op_id": {"type": "string"},
            "message": {"type": "string"}, "lease": _ref("Lease")}}, "Requested: the node restores on its next poll"),
            **_errors(400, 401, 403, 404, 409)}}},
    "/api/v1/keys": {
        "get": {"operationId": "listKeys", "summary": "Saved SSH keys", "security": SECURED,
                "responses": {"200": _json({"type": "object", "properties": {
                    "keys": {"type": "array", "items": _ref("SshKey")}}}, "Saved keys"), **_errors(401)}},
        "post": {"operationId": "addKey", "summary": "Save an SSH public key", "security": SECURED,
                 "requestBody": {"required": True, "content": {"application/json": {"schema": {
                     "type": "object", "required": ["public_key"], "properties": {
                         "name": {"type": "string"}, "public_key": {"type": "string"}}}}}},
                 "responses": {"201": _json(_ref("SshKey"), "Saved"), **_errors(400, 401, 403)}}},
    "/api/v1/keys/{key_id}": {"delete": {
        "operationId": "deleteKey", "summary": "Delete a saved key (leases keep theirs)", "security": SECURED,
        "parameters": [KEY_ID_PARAM],
        "responses": {"200": _json({"type": "object", "properties": {"deleted": {"type": "integer"}}}, "Deleted"),
                      **_errors(401, 403, 404)}}},
    "/api/v1/volumes": {"get": {
        "operationId": "listVolumes", "summary": "Your network volumes", "security": SECURED,
        "responses": {"200": _json({"type": "object", "properties": {"volumes": {"type": "array", "items": {
            "type": "object"}}}}, "Your volumes"), **_errors(401)}}},
    "/api/v1/snapshots": {"get": {
        "operationId": "listSnapshots", "summary": "Your snapshots", "security": SECURED,
        "responses": {"200": _json({"type": "object", "properties": {"snapshots": {"type": "array", "items": {
            "type": "object"}}}}, "Your snapshots"), **_errors(401)}}},
})


# --- storage, sites and images: the actions of My storage (storage.api) -------------
SCHEMAS.update({
    "Volume": {"type": "object", "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "site": {"type": "string"},
        "size_tb": {"type": "integer"}, "state": {"type": "string"}, "created_at": STAMP, "paid_until": STAMP,
        "deleted_at": STAMP, "attached_to": {"type": "array", "items": {"type": "integer"}}}},
    "Snapshot": {"type": "object", "properties": {
        "id": {"type": "integer"}, "lease": {"type": ["integer", "null"]}, "site": {"type": ["string", "null"]},
        "region": {"type": "string"}, "size_tb": {"type": "integer"}, "state": {"type": "string"},
        "created_at": STAMP, "paid_until": STAMP, "deleted_at": STAMP}},
    "ObjectStorage": {"type": "object", "properties": {
        "id": {"type": "integer"}, "site": {"type": "string"}, "quota_gb": {"type": "integer"},
        "state": {"type": "string"}, "endpoint": {"type": "string"}, "created_at": STAMP,
        "keys": {"type": "array", "items": {"type": "object", "properties": {
            "id": {"type": "integer"}, "access_key": {"type": "string"}, "created_at": STAMP}}}}},
    "S3Secret": {"type": "object", "description": "Shown once: an Idempotency-Key replay of it is a 409",
                 "properties": {"account": {"type": "integer"}, "endpoint": {"type": "string"},
                                "access_key": {"type": "string"}, "secret_key": {"type": "string"}}},
})
_LEASE_BODY = {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["lease"], "properties": {"lease": {"type": "integer"}}}}}}
_SIZE = {"type": "integer", "minimum": 1, "maximum": 100}


def _op(op_id: str, summary: str, ok: str, schema: dict, *errors: int, params=(ID_PARAM,), body=None) -> dict:
    operation = {"operationId": op_id, "summary": summary, "security": SECURED, "parameters": list(params),
                 "responses": {ok: _json(schema, summary), **_errors(*errors)}}
    if body is not None:
        operation["requestBody"] = body
    return operation


PATHS["/api/v1/volumes"]["post"] = _op(
    "orderVolume", "Order a network volume; its first 30 days are paid from the balance", "201", _ref("Volume"),
    400, 401, 402, 403, 409, params=(), body={"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["site", "size_tb"], "properties": {
            "site": {"type": "string"}, "size_tb": _SIZE, "name": {"type": "string", "default": "data"}}}}}})
PATHS["/api/v1/volumes"]["get"]["responses"]["200"] = _json(
    {"type": "object", "properties": {"volumes": {"type": "array", "items": _ref("Volume")}}}, "Your volumes")
PATHS["/api/v1/snapshots"]["post"] = _op(
    "takeSnapshot", "Snapshot a running or suspended lease's disk; billed for what it stores", "201",
    _ref("Snapshot"), 400, 401, 402, 403, 404, 409, params=(), body={"required": True, "content": {
        "application/json": {"schema": {"type": "object", "required": ["lease", "size_tb"], "properties": {
            "lease": {"type": "integer"}, "size_tb": _SIZE}}}}})
PATHS["/api/v1/snapshots"]["get"]["responses"]["200"] = _json(
    {"type": "object", "properties": {"snapshots": {"type": "array", "items": _ref("Snapshot")}}}, "Your snapshots")
_DELETED = {"type": "object", "properties": {"deleted": {"type": "integer"}}}
PATHS.update({
    "/api/v1/volumes/{id}": {"delete": _op("deleteVolume", "Delete a volume: detached, its data purged", "200",
                                           _DELETED, 401, 403, 404)},
    "/api/v1/volumes/{id}/attach": {"post": _op("attachVolume", "Attach to a running lease at the volume's site",
                                                "200", _ref("Volume"), 400, 401, 403, 404, 409, body=_LEASE_BODY)},
    "/api/v1/volumes/{id}/detach": {"post": _op("detachVolume", "Detach from a lease", "200", _ref("Volume"),
                                                400, 401, 403, 404, 409, body=_LEASE_BODY)},
    "/api/v1/volumes/{id}/grow": {"post": _op(
        "growVolume", "Grow a volume; the extra TB are paid pro rata from the balance", "200", _ref("Volume"),
        400, 401, 402, 403, 404, 409, body={"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["size_tb"], "properties": {"size_tb": _SIZE}}}}})},
    "/api/v1/snapshots/{id}": {"delete": _op("deleteSnapshot", "Delete a snapshot", "200", _DELETED, 401, 403, 404)},
    "/api/v1/object-storage": {
        "get": _op("listObjectStorage", "Your object-storage accounts and their live keys", "200",
                   {"type": "object", "properties": {"accounts": {"type": "array", "items": _ref("ObjectStorage")}}},
                   401, params=()),
        "post": _op("openObjectStorage", "Open object storage at a site (or change its quota); billed per "
                                         "GB-month stored", "201", _ref("ObjectStorage"), 400, 401, 403, 409,
                    params=(), body={"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["site", "quota_gb"], "properties": {
                            "site": {"type": "string"}, "quota_gb": {"type": "integer", "minimum": 1}}}}}})},
    "/api/v1/object-storage/{id}/keys": {"post": _op("newS3Key", "A new key; the secret is in this answer only",
                                                     "201", _ref("S3Secret"), 401, 403, 404, 409)},
    "/api/v1/object-storage/keys/{id}/rotate": {"post": _op(
        "rotateS3Key", "A new key, then this one revoked; the secret is in this answer only", "201",
        _ref("S3Secret"), 401, 403, 404, 409)},
    "/api/v1/object-storage/keys/{id}": {"delete": _op("revokeS3Key", "Revoke a key: it stops working", "200",
                                                       {"type": "object"}, 401, 403, 404, 409)},
    "/api/v1/invoices/{id}/pay": {"post": _op("payInvoice", "Pay an open order or renewal invoice from the balance",
                                              "200", _ref("Invoice"), 401, 402, 403, 404, 409)},
    "/api/v1/account/top-up": {"post": _op(
        "topUp", "A top-up invoice for the balance (pay it in a coin: /api/v1/invoices/{id}/quote)", "201",
        _ref("Invoice"), 400, 401, 403, params=(), body={"required": True, "content": {"application/json": {
            "schema": {"type": "object", "required": ["amount_usd"], "properties": {
                "amount_usd": {"type": "string", "examples": ["50.00"]}}}}}})},
    "/api/v1/sla-claims": {
        "get": _op("listSlaClaims", "Your SLA claims", "200", {"type": "object", "properties": {
            "claims": {"type": "array", "items": {"type": "object"}}}}, 401, params=()),
        "post": _op("fileSlaClaim", "File an SLA claim for a lease and a month; an operator decides", "201",
                    {"type": "object"}, 400, 401, 403, 409, params=(), body={"required": True, "content": {
                        "application/json": {"schema": {"type": "object", "required": ["lease", "period"],
                                                        "properties": {"lease": {"type": "integer"},
                                                                       "period": {"type": "string",
                                                                                  "examples": ["2026-11"]},
                                                                       "message": {"type": "string"}}}}}})},
    "/api/v1/webhook": {
        "get": _op("getWebhook", "The account's webhook endpoint and its latest deliveries", "200",
                   {"type": "object"}, 401, 404, params=()),
        "post": _op("setWebhook", "Set the webhook URL; a new endpoint's secret is in this answer only", "200",
                    {"type": "object"}, 400, 401, 403, params=(), body={"required": True, "content": {
                        "application/json": {"schema": {"type": "object", "required": ["url"],
                                                        "properties": {"url": {"type": "string"}}}}}}),
        "delete": _op("deleteWebhook", "Remove the webhook: no more events are sent", "200", {"type": "object"},
                      401, 403, 404, params=())},
    "/api/v1/webhook/rotate": {"post": _op("rotateWebhookSecret", "A new signing secret, in this answer only",
                                           "200", {"type": "object"}, 401, 403, 404, params=())},
    "/api/v1/webhook/test": {"post": _op("testWebhook", "Queue a webhook.test event", "202", {"type": "object"},
                                         401, 403, 404, params=())},
    "/api/v1/webhook/deliveries/{id}/redeliver": {"post": _op(
        "redeliverWebhook", "Queue a delivery again, with a new delivery id", "202", {"type": "object"},
        401, 403, 404)},
    "/api/v1/quotes/{id}/confirm-late": {"post": _op(
        "confirmLatePayment", "Use a late payment (on the balance) for what its quote was meant to buy", "200",
        _ref("Invoice"), 401, 403, 404, 409)},
    "/api/v1/sites": {"get": {"operationId": "listSites", "summary": "The sites one can order at", "security": [],
                              "responses": {"200": _json({"type": "object", "properties": {"sites": {
                                  "type": "array", "items": {"type": "object", "properties": {
                                      "code": {"type": "string"}, "name": {"type": "string"},
                                      "region": {"type": "string"}}}}}}, "Sites")}}},
    "/api/v1/images": {"get": {"operationId": "listImages", "summary": "The images one can order", "security": [],
                               "responses": {"200": _json({"type": "object", "properties": {"images": {
                                   "type": "array", "items": {"type": "object", "properties": {
                                       "slug": {"type": "string"}, "name": {"type": "string"},
                                       "vendor": {"type": "string"}, "image_ref": {"type": ["string", "null"]},
                                       "start_command": {"type": "string"},
                                       "ports": {"type": "array", "items": {"type": "integer"}},
                                       "description": {"type": "string"},
                                       "generated_secret": {"type": ["string", "null"]}}}}}}, "Images")}}},
})


#: Parts of this schema kept in modules of their own (each has PATHS, SCHEMAS and may have
#: extend(schemas, paths) for what it adds to the schemas above); imported by name here, as
#: the apps' are, since they import this module's helpers.
PARTS = ("rental.api_schema_workbench",)


def _contributions() -> list:
    found = [import_module(name) for name in PARTS]
    for app in API_APPS_WITH_PATHS:
        try:
            found.append(import_module(f"{app}.api_schema"))
        except ImportError:
            continue
    return found


#: Every write takes an Idempotency-Key (rental.idempotency, ADR 0011).
IDEMPOTENCY_PARAM = {
    "name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string", "maxLength": 255},
    "description": "Any unique string (a UUID). The same key with the same request, within "
                   "API_IDEMPOTENCY_KEY_HOURS, returns the first successful answer again (header "
                   "Idempotent-Replayed: true) and does nothing twice; with another request: 422. "
                   "Keys are per account; a refused request (4xx) keeps no key."}
WRITE_OPERATIONS = ("post", "put", "patch", "delete")


def _with_idempotency(paths: dict) -> None:
    for operations in paths.values():
        for method, operation in operations.items():
            if method in WRITE_OPERATIONS and operation.get("security") != []:
                operation.setdefault("parameters", []).append({"$ref": "#/components/parameters/IdempotencyKey"})
                operation.setdefault("responses", {}).setdefault("422", _json(
                    _ref("Error"), "idempotency_key_reused: this key was used for another request"))


def build_schema() -> dict:
    paths, schemas = copy.deepcopy(PATHS), copy.deepcopy(SCHEMAS)
    for module in _contributions():
        paths.update(copy.deepcopy(getattr(module, "PATHS", {})))
        schemas.update(copy.deepcopy(getattr(module, "SCHEMAS", {})))
        if hasattr(module, "extend"):
            module.extend(schemas, paths)
    _with_idempotency(paths)
    return {
        "openapi": "3.1.0",
        "info": {"title": "GPU Rental API", "version": "1.0.0",
                 "description": "Dedicated GPUs by the week or the month. Money in integer USD cents "
                                "(and *_usd decimal strings). Errors: JSON {error, message[, fields]} with 4xx."},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {"schemas": schemas, "parameters": {"IdempotencyKey": IDEMPOTENCY_PARAM}, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer", "description": "API token from account settings"}}},
    }
