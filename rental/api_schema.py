"""The OpenAPI 3.1 description of /api/v1, written by hand. Other apps add their paths by
exposing `PATHS` (and optionally `SCHEMAS`) in `<app>.api_schema`; sizing's estimate
endpoint is merged in this way when that module exists."""
import copy
from importlib import import_module

from .models import ADDON_LIMITS_TB, RETIRED_ADDONS


def iso(value) -> str | None:
    """A moment in the API's and the webhooks' JSON (ISO 8601, UTC), or null."""
    return value.isoformat() if value else None


API_APPS_WITH_PATHS = ("sizing",)


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


# --- issue 30: the endpoints the command-line client (cli/) uses -------------------------------
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
        "summary": "Replace the stopped instance's disk with one of your snapshots at the lease's site (issue 26)",
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


def _contributions() -> list:
    found = []
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
