"""The OpenAPI schema's workbench and teams parts (rental.api_schema builds the whole): a
lease's image, variables, secrets and ports, the account's registry credentials and
variables, and the team's members."""
from .api_schema import _DELETED, STAMP, _op, _ref

# --- the workbench: image, variables, secrets, ports (rental.workbench) -----------------------
_NAMES = {"type": "object", "additionalProperties": {"type": "string"},
          "description": "NAME: value; a NAME is [A-Za-z_][A-Za-z0-9_]* and not reserved (PATH, HOME, NVIDIA_…)"}
SCHEMAS = {
    "Port": {"type": "object", "required": ["port"], "properties": {
        "port": {"type": "integer", "minimum": 1, "maximum": 65535, "not": {"const": 22}},
        "allow": {"type": "array", "items": {"type": "string"}, "examples": [["203.0.113.0/24", "2001:db8::/32"]],
                  "description": "Source networks (IPv4/IPv6 CIDR); empty or absent: anyone"}}},
    "Workbench": {"type": "object", "description": "Secrets are named, never returned", "properties": {
        "image": {"type": "string"}, "image_ref": {"type": ["string", "null"]}, "own_image": {"type": "boolean"},
        "registry_credential": {"type": ["string", "null"]}, "start_command": {"type": "string"},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "secret_names": {"type": "array", "items": {"type": "string"}},
        "ports": {"type": "array", "items": _ref("Port")},
        "pull": {"type": ["object", "null"], "properties": {"done_bytes": {"type": "integer"},
                                                             "total_bytes": {"type": "integer"},
                                                             "percent": {"type": ["integer", "null"]}}},
        "error": {"type": ["object", "null"], "properties": {
            "code": {"type": "string", "examples": ["image_not_found", "image_too_large", "image_no_shell",
                                                    "registry_auth_failed", "image_pulling"]},
            "text": {"type": "string"}, "detail": {"type": "string"}}},
        "addresses": {"type": "object", "additionalProperties": {"type": "string"},
                      "description": "container port -> public host:port, once the node published it"},
        "changed": {"type": "array", "items": {"type": "string"}}}},
    "RegistryCredential": {"type": "object", "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "server": {"type": "string"},
        "username": {"type": "string"}, "created_at": STAMP, "updated_at": STAMP}},
    "AccountVariable": {"type": "object", "properties": {
        "name": {"type": "string"}, "secret": {"type": "boolean"},
        "value": {"type": "string", "description": "Absent for a secret"}, "updated_at": STAMP}},
}
_PATCH_NAMES = {"type": "object", "additionalProperties": {"type": ["string", "null"]},
                "description": "NAME: value sets it, NAME: null removes it"}
_NAME_PARAM = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_CREDENTIAL_PARAM = {"name": "credential_id", "in": "path", "required": True, "schema": {"type": "integer"}}
PATHS = {
    "/api/v1/leases/{id}/workbench": {
        "get": _op("getLeaseWorkbench", "The lease's image, variables, secrets (names), ports and their addresses",
                   "200", _ref("Workbench"), 401, 403, 404),
        "patch": _op("changeLeaseWorkbench", "Change variables, secrets, ports or the start command: the node "
                     "recreates the container (disk kept)", "200", _ref("Workbench"), 400, 401, 403, 404, 409,
                     body={"required": True, "content": {"application/json": {"schema": {
                         "type": "object", "additionalProperties": False, "properties": {
                             "env": _PATCH_NAMES, "secrets": _PATCH_NAMES, "start_command": {"type": "string"},
                             "ports": {"type": "array", "items": _ref("Port")}}}}}})},
    "/api/v1/registry-credentials": {
        "get": _op("listRegistryCredentials", "Your registry credentials (no passwords)", "200", {
            "type": "object", "properties": {"registry_credentials": {"type": "array",
                                                                      "items": _ref("RegistryCredential")}}},
            401, params=()),
        "post": _op("saveRegistryCredential", "Save one (the same name replaces it)", "201",
                    _ref("RegistryCredential"), 400, 401, 403, params=(), body={"required": True, "content": {
                        "application/json": {"schema": {"type": "object", "required": [
                            "name", "server", "username", "password"], "properties": {
                            "name": {"type": "string"}, "server": {"type": "string"},
                            "username": {"type": "string"}, "password": {"type": "string"}}}}}})},
    "/api/v1/registry-credentials/{credential_id}": {
        "delete": _op("deleteRegistryCredential", "Delete one (409 while a live lease pulls with it)", "200",
                      _DELETED, 401, 403, 404, 409, params=(_CREDENTIAL_PARAM,))},
    "/api/v1/account/variables": {
        "get": _op("listAccountVariables", "Variables and secrets (by name) added to new orders", "200", {
            "type": "object", "properties": {"variables": {"type": "array", "items": _ref("AccountVariable")}}},
            401, params=()),
        "post": _op("saveAccountVariable", "Save one (the same name replaces it)", "201", _ref("AccountVariable"),
                    400, 401, 403, params=(), body={"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["name", "value"], "properties": {
                            "name": {"type": "string"}, "value": {"type": "string"},
                            "secret": {"type": "boolean", "default": False}}}}}})},
    "/api/v1/account/variables/{name}": {
        "delete": _op("deleteAccountVariable", "Delete one", "200", {"type": "object"}, 401, 403, 404,
                      params=(_NAME_PARAM,))},
}

# Teams (ADR 0017): the account's members; changes are the owners' (right "team").
_ROLE = {"type": "string", "enum": ["owner", "billing", "developer", "read_only"]}
TEAM_PATHS = {
    "/api/v1/team": {
        "get": _op("getTeam", "The members and their roles, your role and rights; owners also the pending "
                   "invitations", "200", {"type": "object"}, 401, 403, params=()),
        "post": _op("inviteMember", "Invite an e-mail address in a role; the single-use `link` is in this answer "
                    "only (and mailed)", "201", {"type": "object"}, 400, 401, 403, params=(),
                    body={"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["email", "role"],
                        "properties": {"email": {"type": "string"}, "role": _ROLE}}}}})},
    "/api/v1/team/members/{id}": {
        "patch": _op("setMemberRole", "Change a member's role (409 for the account holder)", "200",
                     {"type": "object"}, 400, 401, 403, 404, 409, body={"required": True, "content": {
                         "application/json": {"schema": {"type": "object", "required": ["role"],
                                                         "properties": {"role": _ROLE}}}}}),
        "delete": _op("removeMember", "Remove a member: their access and tokens for this account end at once",
                      "200", {"type": "object"}, 401, 403, 404, 409)},
    "/api/v1/team/invitations/{id}": {"delete": _op("withdrawInvitation", "Withdraw a pending invitation", "200",
                                                    {"type": "object"}, 401, 403, 404)},
}
PATHS.update(TEAM_PATHS)


def extend(schemas: dict, paths: dict) -> None:
    """The order body's workbench fields, and a lease's workbench, in the schemas they belong to."""
    schemas["OrderRequest"]["properties"].update({
        "image_ref": {"type": "string", "examples": ["ghcr.io/org/name:tag"],
                      "description": "Your own image instead of the template's (needs /bin/sh; SSH is added)"},
        "registry_credential": {"type": ["string", "integer"], "description": "A saved credential's name or id"},
        "start_command": {"type": "string", "description": "Default: the template's (none with your own image)"},
        "env": _NAMES, "secrets": {**_NAMES, "description": "Stored encrypted, never returned"},
        "ports": {"type": "array", "items": _ref("Port"), "description": "Default: the template's"}})
    schemas["Lease"]["properties"]["workbench"] = _ref("Workbench")
