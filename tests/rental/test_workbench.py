"""The customer's workbench on the storefront (rental.workbench): the validators and their
messages, ordering with an image of one's own, variables, secrets and ports on the page and
in the API, the Jupyter template's token, the lease page's change form, the account's
registry credentials and variables — and a secret never shown again anywhere after saving."""
import ipaddress
import json

import pytest
from django.urls import reverse
from django.utils import timezone
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from billing.services import balance_top_up
from inventory.audit import AuditEntry
from rental.accounts.services import api_token_create
from rental.models import AccountVariable, Image, Lease, LeaseEvent, RegistryCredential
from rental.workbench import (
    account_variable_set,
    lease_secrets,
    registry_credential_save,
    workbench_for_order,
)
from rental.workbench_rules import (
    Problem,
    WorkbenchRefused,
    clean_ports,
    env_name_problems,
    image_ref_problems,
    registry_of,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"
SECRET = "hf_page-secret-31337"
PASSWORD = "registry-pass-4242"


# --- validators -----------------------------------------------------------------------------------

@pytest.mark.parametrize("ref", ["ubuntu", "ubuntu:22.04", "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                                 "ghcr.io/org/team/name:v1", "registry.example:5000/a/b", "localhost/x:latest",
                                 "quay.io/jupyter/pytorch-notebook:cuda12-latest",
                                 "nvcr.io/nvidia/pytorch@sha256:" + "a" * 64, "a.b/c_d__e-f.g:T_1.2-x"])
def test_image_references_docker_pulls_are_accepted(ref):
    assert image_ref_problems(ref) == []


@pytest.mark.parametrize("ref", ["", " ubuntu", "Ubuntu", "ubuntu:", "ubuntu:a b", "-rm/x", "a//b", "a/b/",
                                 "ubuntu@sha256:xyz", "ubuntu:" + "t" * 129, "x" * 256, "a/B", "ghcr.io/UP/x",
                                 "ubuntu;rm -rf /", "--help", 42, None])
def test_malformed_image_references_are_refused_with_a_code(ref):
    problems = image_ref_problems(ref)
    assert problems and problems[0].code in ("image_ref_invalid", "image_ref_too_long")


def test_the_registry_of_a_reference():
    assert registry_of("ubuntu") == registry_of("library/ubuntu") == "docker.io"
    assert registry_of("ghcr.io/a/b:1") == "ghcr.io"
    assert registry_of("registry.example:5000/a") == "registry.example:5000"
    assert registry_of("localhost/a") == "localhost"


@pytest.mark.parametrize("name, code", [("1ABC", "env_name_invalid"), ("A-B", "env_name_invalid"),
                                        ("", "env_name_invalid"), ("PATH", "env_name_reserved"),
                                        ("NVIDIA_VISIBLE_DEVICES", "env_name_reserved"),
                                        ("CUDA_VISIBLE_DEVICES", "env_name_reserved"),
                                        ("A" * 129, "env_name_too_long")])
def test_variable_names_are_checked(name, code):
    assert [p.code for p in env_name_problems(name, "env")] == [code]


@pytest.mark.parametrize("ports, code", [
    ([{"port": 22}], "port_ssh"), ([{"port": 0}], "port_invalid"), ([{"port": 65536}], "port_invalid"),
    ([{"port": "8888"}], "port_invalid"), ([{"port": 8888}, {"port": 8888}], "port_duplicate"),
    ([{"port": 8888, "allow": ["10.0.0.0/33"]}], "cidr_invalid"), ([{"port": 8888, "allow": ["nope"]}], "cidr_invalid"),
    ([{"port": 8888, "allow": "0.0.0.0/0"}], "cidr_invalid"), ([{"port": p} for p in range(8000, 8006)], "ports_too_many"),
    ([{"port": 8888, "allow": [f"10.0.{i}.0/24" for i in range(17)]}], "cidr_too_many"), ("8888", "ports_invalid"),
])
def test_ports_are_checked(ports, code):
    _clean, problems = clean_ports(ports)
    assert code in [p.code for p in problems]


def test_ports_are_normalised():
    clean, problems = clean_ports([8888, {"port": 6006, "allow": ["203.0.113.9/24", "2001:db8::1", "203.0.113.0/24"]}])
    assert problems == []
    assert clean == [{"port": 8888, "allow": ["0.0.0.0/0", "::/0"]},
                     {"port": 6006, "allow": ["203.0.113.0/24", "2001:db8::1/128"]}]


def test_every_limit_is_a_setting(settings, customer, catalog):
    settings.WORKBENCH_MAX_PORTS = 1
    settings.WORKBENCH_MAX_ENV = 2
    settings.WORKBENCH_MAX_ENV_VALUE_BYTES = 4
    image = Image.objects.get(slug="pytorch-2.5-cuda-12.4")
    with pytest.raises(WorkbenchRefused) as refused:
        workbench_for_order(customer=customer, image=image, ports=[8888, 6006], env={"A": "12345"})
    assert {p.code for p in refused.value.problems} == {"ports_too_many", "env_value_too_long"}
    with pytest.raises(WorkbenchRefused) as refused:
        workbench_for_order(customer=customer, image=image, env={"A": "1", "B": "2"}, secrets={"C": "3"})
    assert refused.value.code == "env_too_many"


# --- properties over random input (Hypothesis) ---------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.integers(), st.none()))
def test_any_input_is_an_image_reference_or_a_named_refusal(ref):
    problems = image_ref_problems(ref)
    assert all(isinstance(p, Problem) and p.code.startswith("image_ref") for p in problems)
    assert not problems or not isinstance(ref, str) or ref != ref.strip() or len(problems) == 1


COMPONENT = st.from_regex(r"\A[a-z0-9]{1,8}([._-][a-z0-9]{1,8}){0,2}\Z")


@settings(max_examples=200, deadline=None)
@given(st.lists(COMPONENT, min_size=1, max_size=3), st.one_of(st.none(), st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}\Z")),
       st.sampled_from(["", "ghcr.io/", "registry.example:5000/", "localhost/"]))
def test_every_well_formed_reference_is_accepted(path, tag, registry):
    # A first component with a dot, before another, names a registry (as `docker pull` reads it).
    assume(registry or len(path) == 1 or "." not in path[0])
    assert image_ref_problems(registry + "/".join(path) + (f":{tag}" if tag else "")) == []


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_a_variable_name_is_accepted_exactly_when_it_is_a_shell_name_and_not_reserved(name):
    import re

    from django.conf import settings as django_settings

    ok = bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)) and name not in django_settings.WORKBENCH_RESERVED_ENV_NAMES \
        and not any(name.startswith(p) for p in django_settings.WORKBENCH_RESERVED_ENV_PREFIXES)
    assert (env_name_problems(name, "env") == []) == ok


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(-5, 70000), st.text(max_size=6)), max_size=4),
       st.lists(st.one_of(st.ip_addresses().map(str), st.text(max_size=20),
                          st.tuples(st.ip_addresses(v=4), st.integers(0, 40)).map(lambda t: f"{t[0]}/{t[1]}")),
                max_size=4))
def test_ports_and_networks_are_kept_exactly_when_valid(ports, allow):
    clean, problems = clean_ports([{"port": p, "allow": allow} for p in ports])
    for item in clean:
        assert 0 < item["port"] < 65536 and item["port"] != 22
        for network in item["allow"]:
            ipaddress.ip_network(network)   # canonical and valid
    valid_ports = [p for p in ports if type(p) is int and 0 < p < 65536 and p != 22]
    if len(ports) <= 5 and len(set(valid_ports)) == len(ports):
        assert [c["port"] for c in clean] == valid_ports
    assert bool(problems) == (len(clean) != len(ports) or len(ports) > 5 or any(
        _bad_network(a) for a in allow) and bool(ports))


def _bad_network(text) -> bool:
    try:
        ipaddress.ip_network(text.strip(), strict=False)
        return not text.strip() or len(text) > 64
    except ValueError:
        return True


# --- the order page ---------------------------------------------------------------------------------

def order_page(client, **fields):
    data = {"site": "DFW-1", "term": "week", "image": "pytorch-2.5-cuda-12.4", "ssh_public_key": KEY,
            "extra_nvme_tb": 0, "network_volume_tb": 0, **fields}
    return client.post(reverse("order", args=["rtx-3090"]), data)


def test_ordering_an_image_of_one_s_own_with_variables_secrets_and_ports(client, customer, catalog):
    client.force_login(customer)
    registry_credential_save(customer=customer, name="work", server="ghcr.io", username="alice", password=PASSWORD,
                             now=timezone.now())
    credential = RegistryCredential.objects.get(name="work")
    response = order_page(client, image_ref="ghcr.io/alice/trainer:1", registry_credential=credential.pk,
                          start_command="python serve.py", env="MODE=train\n# a comment\nEMPTY=",
                          secrets=f"HF_TOKEN={SECRET}", ports="8080:203.0.113.0/24\n6006")
    assert response.status_code == 302, response.content.decode()[:2000]
    lease = Lease.objects.get()
    assert (lease.image_ref, lease.registry_credential, lease.start_command) == (
        "ghcr.io/alice/trainer:1", credential, "python serve.py")
    assert lease.env == {"MODE": "train", "EMPTY": ""}
    assert lease.secret_names == ["HF_TOKEN"] and lease_secrets(lease) == {"HF_TOKEN": SECRET}
    assert SECRET not in lease.sealed_secrets
    assert lease.ports == [{"port": 8080, "allow": ["203.0.113.0/24"]}, {"port": 6006, "allow": ["0.0.0.0/0", "::/0"]}]
    page = client.get(response["Location"]).content.decode()
    assert "ghcr.io/alice/trainer:1" in page and "HF_TOKEN" in page and "MODE=train" in page
    assert SECRET not in page and PASSWORD not in page
    event = LeaseEvent.objects.get(lease=lease, kind="workbench_set")
    assert SECRET not in json.dumps(event.data) and event.data["secret_names"] == ["HF_TOKEN"]


def test_the_order_page_names_each_problem_and_never_sends_a_secret_back(client, customer, catalog):
    client.force_login(customer)
    response = order_page(client, image_ref="Not An Image", env="PATH=/x\nnot a line", secrets=f"TOKEN={SECRET}",
                          ports="22\n8888:10.0.0.0/99")
    assert response.status_code == 400
    page = response.content.decode()
    assert "is not an image reference" in page
    assert "Line 2 is not NAME=value" in page
    assert "Port 22 is the instance&#x27;s SSH" in page
    assert SECRET not in page
    assert not Lease.objects.exists()
    response = order_page(client, env="PATH=/x", secrets=f"TOKEN={SECRET}", ports="22")
    page = response.content.decode()
    assert response.status_code == 400 and "PATH is set by the instance itself" in page and SECRET not in page
    # Said together with the form's other problems (here: no SSH key), not one round after another.
    response = order_page(client, ssh_public_key="", ports="22")
    assert response.status_code == 400 and "Port 22 is the instance&#x27;s SSH" in response.content.decode()


def test_a_credential_for_another_registry_is_refused(client, customer, catalog):
    client.force_login(customer)
    credential = registry_credential_save(customer=customer, name="hub", server="docker.io", username="a",
                                          password=PASSWORD, now=timezone.now())
    response = order_page(client, image_ref="ghcr.io/a/b", registry_credential=credential.pk)
    assert response.status_code == 400 and "is for docker.io, but the image is pulled from ghcr.io" in \
        response.content.decode()


def test_the_jupyter_template_makes_a_token_shown_once_and_says_how_to_get_in(client, customer, catalog):
    client.force_login(customer)
    balance_top_up(customer=customer, amount_cents=100_000_00, now=timezone.now())
    response = order_page(client, image="jupyter-pytorch-cuda")
    assert response.status_code == 302
    lease = Lease.objects.get()
    token = lease_secrets(lease)["JUPYTER_TOKEN"]
    assert len(token) >= 32 and lease.ports == [{"port": 8888, "allow": ["0.0.0.0/0", "::/0"]}]
    assert '"$JUPYTER_TOKEN"' in lease.start_command and "--port=8888" in lease.start_command
    assert lease.image.image_ref == "quay.io/jupyter/pytorch-notebook:cuda12-latest"
    first = client.get(response["Location"]).content.decode()
    assert token in first and "Shown once" in first
    again = client.get(response["Location"]).content.decode()
    assert token not in again
    assert "jupyter server list" in again and "8888" in again


def test_account_variables_are_added_to_new_orders_and_the_lease_s_own_win(customer, catalog):
    now = timezone.now()
    account_variable_set(customer=customer, name="HF_HOME", value="/workspace/hf", secret=False, now=now)
    account_variable_set(customer=customer, name="HF_TOKEN", value="account-token", secret=True, now=now)
    account_variable_set(customer=customer, name="WANDB_KEY", value="account-wandb", secret=True, now=now)
    image = Image.objects.get(slug="pytorch-2.5-cuda-12.4")
    spec = workbench_for_order(customer=customer, image=image, env={"HF_HOME": "/data"},
                               secrets={"WANDB_KEY": "lease-wandb"})
    assert spec.env == {"HF_HOME": "/data"}
    assert spec.secrets == {"HF_TOKEN": "account-token", "WANDB_KEY": "lease-wandb"}
    row = AccountVariable.objects.get(name="HF_TOKEN")
    assert row.value == "" and "account-token" not in row.sealed_value
    assert "account-token" not in json.dumps(list(AuditEntry.objects.values_list("detail", flat=True)))


# --- the lease page's change form -------------------------------------------------------------------------

@pytest.fixture
def lease_with_secret(client, customer, catalog):
    client.force_login(customer)
    balance_top_up(customer=customer, amount_cents=100_000_00, now=timezone.now())
    order_page(client, env="MODE=train", secrets=f"HF_TOKEN={SECRET}", ports="8888", pay_from_balance="on")
    return Lease.objects.get()


def test_the_lease_page_changes_variables_secrets_ports_and_command(client, customer, lease_with_secret):
    lease = lease_with_secret
    url = reverse("lease_workbench", args=[lease.pk])
    response = client.post(url, {"env": "MODE=eval\nNEW=1", "secrets": "OTHER=other-secret-8080",
                                 "ports": "8888:198.51.100.0/24", "start_command": "sleep infinity"})
    assert response.status_code == 302
    lease.refresh_from_db()
    assert lease.env == {"MODE": "eval", "NEW": "1"}
    assert lease_secrets(lease) == {"HF_TOKEN": SECRET, "OTHER": "other-secret-8080"}
    assert lease.ports == [{"port": 8888, "allow": ["198.51.100.0/24"]}] and lease.start_command == "sleep infinity"
    client.post(url, {"env": "", "remove_secrets": ["HF_TOKEN"], "ports": "", "start_command": ""})
    lease.refresh_from_db()
    assert (lease.env, lease.secret_names, lease.ports, lease.start_command) == ({}, ["OTHER"], [], "")
    events = LeaseEvent.objects.filter(lease=lease, kind="workbench_changed")
    assert events.count() == 2 and all(e.actor == customer for e in events)
    assert "other-secret-8080" not in json.dumps([e.data for e in events]) + "".join(e.reason for e in events)
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert "other-secret-8080" not in page and SECRET not in page and "OTHER" in page


def test_a_refused_change_is_shown_on_the_lease_page_without_the_secret(client, lease_with_secret):
    lease = lease_with_secret
    response = client.post(reverse("lease_workbench", args=[lease.pk]),
                           {"env": "1BAD=x", "secrets": "GOOD=typed-secret-999", "ports": "8888:not-a-net"},
                           follow=True)
    page = response.content.decode()
    assert "is not a variable name" in page and "is not an IPv4 or IPv6 network" in page
    assert "typed-secret-999" not in page and "1BAD=x" in page
    lease.refresh_from_db()
    assert lease.env == {"MODE": "train"} and not LeaseEvent.objects.filter(kind="workbench_changed").exists()


def test_another_customer_cannot_change_the_lease(client, other_customer, lease_with_secret):
    client.force_login(other_customer)
    assert client.post(reverse("lease_workbench", args=[lease_with_secret.pk]), {"env": "A=1"}).status_code == 404


# --- the account page ------------------------------------------------------------------------------------

def test_registry_credentials_and_account_secrets_are_write_only_on_the_settings_page(client, customer, catalog):
    client.force_login(customer)
    assert client.post(reverse("registry_credential_create"), {"name": "work", "server": "https://GHCR.io/",
                                                               "username": "alice", "password": PASSWORD}).status_code == 302
    assert client.post(reverse("account_variable_create"), {"name": "HF_TOKEN", "value": SECRET,
                                                            "secret": "on"}).status_code == 302
    assert client.post(reverse("account_variable_create"), {"name": "HF_HOME", "value": "/w"}).status_code == 302
    page = client.get(reverse("account_settings")).content.decode()
    assert "ghcr.io" in page and "HF_TOKEN" in page and "HF_HOME" in page and "/w" in page
    assert PASSWORD not in page and SECRET not in page
    refused = client.post(reverse("account_variable_create"), {"name": "PATH", "value": SECRET, "secret": "on"})
    assert refused.status_code == 400 and "PATH is set by the instance itself" in refused.content.decode()
    assert SECRET not in refused.content.decode()
    refused = client.post(reverse("registry_credential_create"), {"name": "x", "server": "not a host!",
                                                                  "username": "a", "password": PASSWORD})
    assert refused.status_code == 400 and PASSWORD not in refused.content.decode()
    credential = RegistryCredential.objects.get()
    assert client.post(reverse("registry_credential_delete", args=[credential.pk])).status_code == 302
    assert not RegistryCredential.objects.exists()


def test_a_credential_a_live_lease_pulls_with_cannot_be_deleted(client, customer, catalog):
    client.force_login(customer)
    credential = registry_credential_save(customer=customer, name="work", server="ghcr.io", username="a",
                                          password=PASSWORD, now=timezone.now())
    order_page(client, image_ref="ghcr.io/a/b", registry_credential=credential.pk)
    response = client.post(reverse("registry_credential_delete", args=[credential.pk]), follow=True)
    assert "pulls with “work”" in response.content.decode()
    assert RegistryCredential.objects.filter(pk=credential.pk).exists()


# --- the API -------------------------------------------------------------------------------------------------

def call(client, method, url, token, body=None):
    return getattr(client, method)(url, data=json.dumps(body) if body is not None else "",
                                   content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")


def order_body(**fields):
    return {"offer": "rtx-3090", "site": "DFW-1", "term": "week", "ssh_key": KEY, **fields}


@pytest.fixture
def token(customer):
    return api_token_create(customer=customer, name="t", scopes=["read", "order", "manage", "pay"])[1]


def test_an_api_order_with_a_workbench_never_returns_a_secret(client, customer, catalog, token):
    response = call(client, "post", "/api/v1/orders", token, order_body(
        image_ref="pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", env={"MODE": "train"},
        secrets={"HF_TOKEN": SECRET}, ports=[{"port": 8888, "allow": ["203.0.113.0/24"]}],
        start_command="python -m http.server 8888"))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["lease"]["workbench"] == {
        "image": "pytorch-2.5-cuda-12.4", "image_ref": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        "own_image": True, "registry_credential": None, "start_command": "python -m http.server 8888",
        "env": {"MODE": "train"}, "secret_names": ["HF_TOKEN"],
        "ports": [{"port": 8888, "allow": ["203.0.113.0/24"]}]}
    lease_id = body["lease"]["id"]
    for url in ("/api/v1/leases", f"/api/v1/leases/{lease_id}", f"/api/v1/leases/{lease_id}/workbench"):
        answer = call(client, "get", url, token)
        assert answer.status_code == 200 and SECRET not in answer.content.decode()
    assert "generated_secrets" not in body and SECRET not in response.content.decode()


@pytest.mark.parametrize("fields, code, field", [
    ({"image_ref": "upper/Case"}, "image_ref_invalid", "image_ref"),
    ({"env": {"PATH": "/x"}}, "env_name_reserved", "env"),
    ({"env": ["A=1"]}, "env_invalid", "env"),
    ({"secrets": {"A": 1}}, "env_value_invalid", "secrets"),
    ({"ports": [{"port": 22}]}, "port_ssh", "ports"),
    ({"ports": [{"port": 80, "allow": ["300.0.0.0/8"]}]}, "cidr_invalid", "ports"),
    ({"registry_credential": "nope", "image_ref": "ghcr.io/a/b"}, "registry_credential_unknown", "registry_credential"),
    ({"start_command": 5}, "start_command_invalid", "start_command"),
])
def test_api_orders_with_a_bad_workbench_are_400_with_codes(client, customer, catalog, token, fields, code, field):
    response = call(client, "post", "/api/v1/orders", token, order_body(**fields))
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"] == code and code in body["codes"][field] and body["fields"][field]
    assert not Lease.objects.exists()


def test_the_jupyter_template_s_token_is_returned_once_by_the_api(client, customer, catalog, token):
    from rental.idempotency import IdempotentRequest

    response = client.post("/api/v1/orders", data=json.dumps(order_body(image="jupyter-pytorch-cuda")),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}",
                           HTTP_IDEMPOTENCY_KEY="order-1")
    assert response.status_code == 201
    generated = response.json()["generated_secrets"]
    assert list(generated) == ["JUPYTER_TOKEN"]
    # Not kept for a replay of the key: the retry learns the order was placed, not the token.
    assert generated["JUPYTER_TOKEN"].encode() not in bytes(IdempotentRequest.objects.get().body)
    detail = call(client, "get", f"/api/v1/leases/{response.json()['lease']['id']}", token)
    assert generated["JUPYTER_TOKEN"] not in detail.content.decode()
    assert detail.json()["workbench"]["secret_names"] == ["JUPYTER_TOKEN"]


def test_a_lease_s_workbench_is_changed_through_the_api(client, customer, catalog, token):
    lease_id = call(client, "post", "/api/v1/orders", token, order_body(secrets={"A_SECRET": SECRET})).json()["lease"]["id"]
    url = f"/api/v1/leases/{lease_id}/workbench"
    response = call(client, "patch", url, token, {"env": {"X": "1"}, "secrets": {"B": "b-secret-xyz", "A_SECRET": None},
                                                  "ports": [8888], "start_command": "sleep 1"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["changed"] == ["env", "secrets", "ports", "start_command"]
    assert body["env"] == {"X": "1"} and body["secret_names"] == ["B"] and "b-secret-xyz" not in response.content.decode()
    assert body["ports"] == [{"port": 8888, "allow": ["0.0.0.0/0", "::/0"]}]
    bad = call(client, "patch", url, token, {"ports": [{"port": 99999}]})
    assert bad.status_code == 400 and bad.json()["error"] == "port_invalid"
    unknown = call(client, "patch", url, token, {"image": "x"})
    assert unknown.status_code == 400 and "image" in unknown.json()["fields"]
    read_only = api_token_create(customer=customer, name="r", scopes=["read"])[1]
    assert call(client, "patch", url, read_only, {"env": {"Y": "2"}}).status_code == 403


def test_registry_credentials_and_account_variables_through_the_api(client, customer, catalog, token):
    created = call(client, "post", "/api/v1/registry-credentials", token,
                   {"name": "work", "server": "ghcr.io", "username": "alice", "password": PASSWORD})
    assert created.status_code == 201 and PASSWORD not in created.content.decode()
    listed = call(client, "get", "/api/v1/registry-credentials", token)
    assert listed.json()["registry_credentials"][0]["server"] == "ghcr.io" and PASSWORD not in listed.content.decode()
    bad = call(client, "post", "/api/v1/registry-credentials", token, {"name": "x", "server": "a b", "username": "u",
                                                                       "password": "p"})
    assert bad.status_code == 400 and bad.json()["error"] == "registry_server_invalid"
    assert call(client, "post", "/api/v1/account/variables", token,
                {"name": "HF_TOKEN", "value": SECRET, "secret": True}).status_code == 201
    variables = call(client, "get", "/api/v1/account/variables", token)
    assert variables.json()["variables"] == [{"name": "HF_TOKEN", "secret": True,
                                              "updated_at": variables.json()["variables"][0]["updated_at"]}]
    assert SECRET not in variables.content.decode()
    order = call(client, "post", "/api/v1/orders", token, order_body(image_ref="ghcr.io/alice/x",
                                                                      registry_credential="work"))
    assert order.status_code == 201 and order.json()["lease"]["workbench"]["secret_names"] == ["HF_TOKEN"]
    credential_id = created.json()["id"]
    assert call(client, "delete", f"/api/v1/registry-credentials/{credential_id}", token).status_code == 409
    assert call(client, "delete", "/api/v1/account/variables/HF_TOKEN", token).status_code == 200
    assert not AccountVariable.objects.exists()


def test_a_change_sends_the_lease_workbench_changed_webhook_with_names_only(client, customer, lease_with_secret,
                                                                           settings):
    from rental.notifications.models import WebhookDelivery
    from rental.notifications.services import EVENTS, webhook_endpoint_save

    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    assert "lease.workbench_changed" in EVENTS
    webhook_endpoint_save(customer=customer, url="https://hooks.example.org/x")
    client.post(reverse("lease_workbench", args=[lease_with_secret.pk]),
                {"env": "MODE=train", "secrets": "NEW_SECRET=hook-secret-1234", "ports": "8888"})
    delivery = WebhookDelivery.objects.get(event="lease.workbench_changed")
    payload = json.dumps(delivery.payload)
    assert delivery.payload["data"]["workbench"]["secret_names"] == ["HF_TOKEN", "NEW_SECRET"]
    assert delivery.payload["data"]["workbench"]["changed"] == ["secrets"]
    assert "hook-secret-1234" not in payload and SECRET not in payload


def test_an_operator_s_template_is_checked_like_an_order(client, operator, catalog):
    client.force_login(operator)
    data = {"slug": "bad-template", "name": "Bad", "vendor": "nvidia", "is_active": "on", "image_ref": "Not Valid",
            "start_command": "", "ports": "[22]", "env": '{"PATH": "/x"}', "generated_secret": "1X",
            "description": ""}
    response = client.post(reverse("admin:rental_image_add"), data)
    page = response.content.decode()
    assert response.status_code == 200 and not Image.objects.filter(slug="bad-template").exists()
    assert "is not an image reference" in page and "Port 22 is the instance" in page
    assert "PATH is set by the instance itself" in page and "is not a variable name" in page
    data.update(image_ref="quay.io/x/y:1", ports="[8888]", env='{"A": "1"}', generated_secret="TOKEN")
    assert client.post(reverse("admin:rental_image_add"), data).status_code == 302
    assert Image.objects.get(slug="bad-template").ports == [8888]


def test_the_public_image_list_describes_the_templates(client, catalog):
    images = {i["slug"]: i for i in client.get("/api/v1/images").json()["images"]}
    jupyter = images["jupyter-pytorch-cuda"]
    assert jupyter["image_ref"] == "quay.io/jupyter/pytorch-notebook:cuda12-latest"
    assert jupyter["ports"] == [8888] and jupyter["generated_secret"] == "JUPYTER_TOKEN"
    assert images["pytorch-2.5-cuda-12.4"]["image_ref"] is None
