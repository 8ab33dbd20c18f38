"""OpenAPI path item for ``GET /api/v1/leases/{id}/metrics`` (fleet/telemetry_api.py), merged
into ``/api/v1/schema`` by rental.api_schema."""
from rental.api_schema import ID_PARAM, SECURED, _errors, _json

from .telemetry_api import COLUMNS, RESOLUTIONS


def _query(name: str, schema: dict, description: str) -> dict:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


NUMBER = {"type": ["number", "null"]}
PATHS = {
    "/api/v1/leases/{id}/metrics": {"get": {
        "operationId": "getLeaseMetrics",
        "summary": "Each GPU's utilisation, VRAM, temperature, power and SM clock (the mean per step), its "
                   "Xid/ECC events, and the term's egress against the included allowance",
        "security": SECURED,
        "parameters": [ID_PARAM,
                       _query("since", {"type": "string"}, "RFC 3339, or a span back from now (90m, 6h, 7d); "
                                                            "default 24 hours before `until`"),
                       _query("until", {"type": "string"}, "RFC 3339, or a span back from now; default now"),
                       _query("resolution", {"type": "integer", "enum": list(RESOLUTIONS)},
                              "Minutes a point; default the finest giving at most 1,500 points a GPU")],
        "responses": {"200": _json({"type": "object", "properties": {
            "lease": {"type": "integer"}, "since": {"type": "string"}, "until": {"type": "string"},
            "resolution_minutes": {"type": "integer"},
            "columns": {"type": "array", "items": {"type": "string", "enum": list(COLUMNS)}},
            "gpus": {"type": "array", "items": {"type": "object", "properties": {
                "node": {"type": "integer"}, "gpu": {"type": "integer"},
                "points": {"type": "array", "items": {"type": "array", "prefixItems": [{"type": "string"}] + [
                    NUMBER] * (len(COLUMNS) - 1)}}}}},
            "events": {"type": "array", "items": {"type": "object", "properties": {
                "at": {"type": "string"}, "gpu": {"type": "integer"}, "kind": {"type": "string", "enum": ["xid", "ecc"]},
                "xid": {"type": "integer"}, "count": {"type": "integer"}, "corrected": {"type": "integer"},
                "uncorrected": {"type": "integer"}}}},
            "egress": {"type": ["object", "null"], "properties": {
                "term_start": {"type": "string"}, "tb_used": {"type": "string"}, "included_tb": {"type": "string"},
                "over_tb": {"type": "string"}}},
            "idle": {"type": "object", "properties": {"util_percent": {"type": "integer"},
                                                      "hours": {"type": "integer"}}}}},
            "The lease's telemetry"), **_errors(400, 401, 403, 404)}}},
}
