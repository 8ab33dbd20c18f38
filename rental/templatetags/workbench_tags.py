"""The workbench on rental's pages (rental.workbench): the lease page's section and the
account settings' registry credentials and variables. Reads only."""
from django import template

from ..models import AccountVariable, RegistryCredential
from ..workbench import effective_image_ref
from ..workbench_rules import ANYONE

register = template.Library()


@register.simple_tag(takes_context=True)
def lease_workbench(context, lease) -> dict:
    """What the lease page shows of the lease's workbench, the form to change it (or the one
    just refused, with its problems) and a template's generated secrets, once."""
    from ..workbench_views import generated_secrets_to_show, lease_workbench_form_to_show

    request = context.get("request")
    generated = generated_secrets_to_show(request, lease) if request is not None else {}
    return {
        "image_ref": effective_image_ref(lease), "own_image": bool(lease.image_ref),
        "credential": lease.registry_credential if lease.registry_credential_id else None,
        "env": sorted(lease.env.items()), "secret_names": list(lease.secret_names),
        "ports": [{**p, "anyone": p["allow"] == ANYONE} for p in lease.ports],
        "start_command": lease.start_command, "generated": sorted(generated.items()),
        "token_name": lease.image.generated_secret if lease.image.generated_secret in lease.secret_names else "",
        "changeable": lease.state in ("pending", "provisioning", "active", "suspended"),
        "form": lease_workbench_form_to_show(request, lease),
    }


@register.simple_tag(takes_context=True)
def account_workbench(context) -> dict:
    """The account's registry credentials and variables (secrets by name only) and the forms
    to add them: the refused ones with their problems when the page shows a refusal."""
    from ..workbench_views import AccountVariableForm, RegistryCredentialForm

    acting = context.get("acting")      # the settings page's: the account the member acts for
    account = acting.account if acting is not None else context["request"].user
    return {
        "credentials": list(RegistryCredential.objects.filter(customer=account)),
        "variables": list(AccountVariable.objects.filter(customer=account).only("pk", "name", "secret", "value")),
        "credential_form": context.get("registry_credential_form") or RegistryCredentialForm(auto_id="rc_%s"),
        "variable_form": context.get("account_variable_form") or AccountVariableForm(auto_id="av_%s"),
    }
