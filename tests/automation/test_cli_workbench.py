"""`gpu-rent` and the workbench: ordering an image of one's own with variables, secrets and
ports; listing, setting and unsetting a lease's variables, secrets and ports; a secret given
by name is read from the environment (never on the command line) and never printed back."""
import json

import pytest
from django.utils import timezone
from gpu_rent import errors

from billing.services import balance_top_up
from rental.accounts.services import ssh_key_add
from rental.models import Lease, LeaseEvent
from rental.workbench import lease_secrets, registry_credential_save

from .helpers import KEY, login

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "cli-secret-value-0042"


def test_ordering_and_changing_a_workbench_from_the_cli(cli, catalog, customer, monkeypatch):  # noqa: F811
    login(cli, customer)
    ssh_key_add(customer=customer, name="k", public_key=KEY)
    balance_top_up(customer=customer, amount_cents=1_000_000, now=timezone.now())
    registry_credential_save(customer=customer, name="work", server="ghcr.io", username="alice", password="pw-1",
                             now=timezone.now())
    monkeypatch.setenv("HF_TOKEN", SECRET)
    code, out, err = cli("create", "--gpu", "3090", "--site", "DFW-1", "--cycle", "week",
                         "--image", "ghcr.io/alice/trainer:1", "--registry-credential", "work",
                         "--env", "MODE=train", "--secret", "HF_TOKEN", "--port", "8888:203.0.113.0/24",
                         "--port", "6006", "--start-command", "python serve.py", "--json")
    assert code == 0, err
    lease = Lease.objects.get()
    assert json.loads(out)["lease"]["workbench"]["secret_names"] == ["HF_TOKEN"] and SECRET not in out
    assert (lease.image_ref, lease.registry_credential.name, lease.env) == ("ghcr.io/alice/trainer:1", "work",
                                                                            {"MODE": "train"})
    assert lease_secrets(lease) == {"HF_TOKEN": SECRET}
    assert lease.ports == [{"port": 8888, "allow": ["203.0.113.0/24"]}, {"port": 6006, "allow": ["0.0.0.0/0", "::/0"]}]

    lid = str(lease.pk)
    assert cli("env", "set", lid, "MODE=eval", "EXTRA=1")[0] == 0
    assert cli("env", "unset", lid, "EXTRA")[0] == 0
    assert cli("secrets", "set", lid, "WANDB=w-secret-77")[0] == 0
    assert cli("secrets", "unset", lid, "HF_TOKEN")[0] == 0
    assert cli("ports", "rm", lid, "6006")[0] == 0
    assert cli("ports", "add", lid, "7860")[0] == 0
    code, out, err = cli("workbench", lid)
    assert code == 0, err
    assert "MODE=eval" in out and "WANDB (value hidden)" in out and "7860" in out and "8888" in out
    assert "w-secret-77" not in out and SECRET not in out
    code, out, _ = cli("secrets", "ls", lid)
    assert out.split() == ["WANDB"]
    lease.refresh_from_db()
    assert lease.env == {"MODE": "eval"} and lease.secret_names == ["WANDB"]
    assert [p["port"] for p in lease.ports] == [8888, 7860]
    assert LeaseEvent.objects.filter(lease=lease, kind="workbench_changed").count() == 6

    code, _out, err = cli("ports", "add", lid, "22")
    assert code == errors.INVALID and "Port 22 is the instance's SSH" in err
    code, _out, err = cli("env", "set", lid, "PATH=/x")
    assert code == errors.INVALID and "PATH is set by the instance itself" in err
    code, _out, err = cli("secrets", "set", lid, "NOT_IN_ENVIRONMENT_X")
    assert code == errors.USAGE and "set the environment variable" in err


def test_registry_credentials_and_account_variables_from_the_cli(cli, catalog, customer, monkeypatch):  # noqa: F811
    login(cli, customer)
    code, out, err = cli("registry", "add", "work", "ghcr.io", "alice", "--password-stdin", stdin="pw-secret-55\n")
    assert code == 0, err
    code, out, _ = cli("registry")
    assert "work" in out and "ghcr.io" in out and "pw-secret-55" not in out
    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert cli("vars", "set", "--secret", "HF_TOKEN")[0] == 0
    assert cli("vars", "set", "HF_HOME=/workspace/hf")[0] == 0
    code, out, _ = cli("vars")
    assert "HF_HOME" in out and "/workspace/hf" in out and "(secret, hidden)" in out and SECRET not in out
    code, _out, err = cli("vars", "set", "PATH=/x")
    assert code == errors.INVALID and "PATH is set by the instance itself" in err
    assert cli("vars", "rm", "HF_HOME")[0] == 0
    assert cli("registry", "rm", "work")[0] == 0
    code, out, _ = cli("vars", "--json")
    assert [v["name"] for v in json.loads(out)["variables"]] == ["HF_TOKEN"]
