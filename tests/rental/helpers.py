"""The customer API's client helpers: an SSH key, a JSON call with a token, an order's body."""
import json

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"


def call(client, method, url, token=None, body=None, raw=None, **extra):
    if token:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    data = raw if raw is not None else (json.dumps(body) if body is not None else "")
    return getattr(client, method)(url, data=data, content_type="application/json", **extra)


def order_body(**overrides):
    body = {"offer": "rtx-3090", "site": "DFW-1", "term": "week", "ssh_key": ED25519,
            "addons": {"extra_nvme_tb": 1}}
    body.update(overrides)
    return body
