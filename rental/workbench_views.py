"""The workbench's pages (rental.workbench): the lease page's "Image, variables and ports"
form, and the account's registry credentials and variables on the settings page. Plain
forms, no JavaScript needed; every change goes through rental.workbench's services (audited).
A secret typed into any of these forms is never rendered back: the fields are write-only."""
from django import forms
from django.contrib import messages
from django.http import Http404, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from .account_page import settings_context
from .forms import WriteOnlyTextarea
from .models import Lease
from .shown_once import keep_to_show_once, take_to_show
from .teams.rights import OPERATE, customer_view
from .workbench import (
    WorkbenchChangeRefused,
    account_variable_delete,
    account_variable_set,
    lease_workbench_change,
    registry_credential_delete,
    registry_credential_save,
    workbench_for_order,
)
from .workbench_rules import WorkbenchRefused, format_ports, parse_assignments, parse_port_spec

GENERATED = "workbench-generated"


def keep_generated_secrets(request, lease: Lease, values: dict[str, str]) -> None:
    """A template's secrets made for a new lease (the Jupyter token): shown once, on the
    lease page the order redirects to (rental.shown_once)."""
    keep_to_show_once(request, GENERATED, {"lease_id": lease.pk, "values": values})


def generated_secrets_to_show(request, lease: Lease) -> dict[str, str]:
    kept = take_to_show(request, GENERATED)
    if kept is None:
        return {}
    if kept.get("lease_id") != lease.pk:        # another lease's: keep it for that page
        keep_to_show_once(request, GENERATED, kept)
        return {}
    return kept["values"]


# --- the order page's part ----------------------------------------------------------------------

def add_problems(form, refused: WorkbenchRefused) -> None:
    """The service's refusal as the form's errors: each on its field where the form has it."""
    for problem in refused.problems:
        form.add_error(problem.field if problem.field in form.fields else None, problem.message)


def order_form_workbench(form) -> None:
    """The order form's image, command, variables, secrets and ports as one checked Workbench
    (form.cleaned_data["workbench"]), each problem on its field. Called by the order page once
    the rest of the form is valid (here rather than in OrderForm.clean: rental.workbench emits
    webhooks, which the forms module must not depend on)."""
    data = form.cleaned_data
    if form.customer is None or data.get("image") is None:
        return
    env, problems = parse_assignments(data.get("env", ""), "env")
    secrets, secret_problems = parse_assignments(data.get("secrets", ""), "secrets")
    ports_text = data.get("ports", "")
    ports = [parse_port_spec(line) for line in ports_text.splitlines() if line.strip()] if ports_text.strip() else None
    try:
        data["workbench"] = workbench_for_order(
            customer=form.customer, image=data["image"], image_ref=data.get("image_ref", ""),
            registry_credential=data.get("registry_credential"),
            start_command=(data.get("start_command") or "").replace("\r\n", "\n") or None, env=env,
            secrets=secrets, ports=ports, extra_problems=problems + secret_problems)
    except WorkbenchRefused as exc:
        add_problems(form, exc)


# --- the lease page's form ---------------------------------------------------------------------

class LeaseWorkbenchForm(forms.Form):
    env = forms.CharField(label=gettext_lazy("Environment variables"), required=False,
                          widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
                          help_text=gettext_lazy("One NAME=value a line; a line removed removes the variable."))
    secrets = forms.CharField(label=gettext_lazy("Set or replace secrets"), required=False,
                              widget=WriteOnlyTextarea(attrs={"rows": 2, "spellcheck": "false",
                                                              "autocomplete": "off"}),
                              help_text=gettext_lazy("One NAME=value a line; stored encrypted, never shown again."))
    remove_secrets = forms.MultipleChoiceField(label=gettext_lazy("Remove secrets"), required=False,
                                               widget=forms.CheckboxSelectMultiple)
    ports = forms.CharField(label=gettext_lazy("Ports"), required=False,
                            widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
                            help_text=gettext_lazy("One port a line, PORT or PORT:CIDR,CIDR (without networks: "
                                                   "anyone). Port 22 is SSH already."))
    start_command = forms.CharField(label=gettext_lazy("Start command"), required=False,
                                    widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}))

    def __init__(self, *args, lease: Lease, **kwargs):
        kwargs.setdefault("initial", {"env": "\n".join(f"{k}={v}" for k, v in sorted(lease.env.items())),
                                      "ports": format_ports(lease.ports), "start_command": lease.start_command})
        super().__init__(*args, **kwargs)
        self.fields["remove_secrets"].choices = [(name, name) for name in lease.secret_names]


def lease_workbench_form(lease: Lease, data=None) -> LeaseWorkbenchForm:
    return LeaseWorkbenchForm(data, lease=lease, auto_id="wb_%s")


def _change_from_form(form: LeaseWorkbenchForm, lease: Lease) -> dict:
    """The form (the whole list of variables, ports and command, secrets to add and remove) as
    the service's patches; problems of the text's own shape raise WorkbenchRefused."""
    data = form.cleaned_data
    env, problems = parse_assignments(data["env"], "env")
    secrets, secret_problems = parse_assignments(data["secrets"], "secrets")
    if problems or secret_problems:
        raise WorkbenchRefused(problems + secret_problems)
    env_patch = {**{name: None for name in lease.env if name not in env}, **env}
    secret_patch = {**{name: None for name in data["remove_secrets"]}, **secrets}
    ports = [parse_port_spec(line) for line in data["ports"].splitlines() if line.strip()]
    return {"env": env_patch, "secrets": secret_patch, "ports": ports,
            "start_command": data["start_command"].replace("\r\n", "\n")}


@customer_view({"POST": OPERATE})
def lease_workbench_update(request, lease_id: int):
    lease = get_object_or_404(Lease.objects.filter(customer=request.account), pk=lease_id)
    form = lease_workbench_form(lease, request.POST)
    if form.is_valid():
        try:
            result = lease_workbench_change(lease_id=lease.pk, customer=request.account, now=timezone.now(),
                                            **_change_from_form(form, lease))
        except WorkbenchChangeRefused as exc:
            messages.error(request, str(exc))
            return redirect(reverse("lease_detail", args=[lease.pk]) + "#workbench")
        except WorkbenchRefused as exc:
            add_problems(form, exc)
        else:
            if result["changed"]:
                messages.success(request, _("Saved: the server recreates the instance's container with the change "
                                            "within a minute; files on the disk are kept."))
            else:
                messages.info(request, _("Nothing changed."))
            return redirect(reverse("lease_detail", args=[lease.pk]) + "#workbench")
    # Shown on the lease page it redirects to, with the problems by their fields (the secrets
    # typed are not kept: they are asked for again).
    kept = {k: v for k, v in request.POST.lists() if k in ("env", "ports", "start_command", "remove_secrets")}
    keep_to_show_once(request, FORM_KEPT, {"lease_id": lease.pk, "data": kept,
                                           "errors": {k: [str(m) for m in v] for k, v in form.errors.items()}})
    return redirect(reverse("lease_detail", args=[lease.pk]) + "#workbench")


FORM_KEPT = "workbench-form"


def lease_workbench_form_to_show(request, lease: Lease) -> LeaseWorkbenchForm:
    """The lease page's form: as the lease is now, or as refused a moment ago, with its problems."""
    kept = take_to_show(request, FORM_KEPT) if request is not None else None
    if kept is None or kept.get("lease_id") != lease.pk:
        if kept is not None:
            keep_to_show_once(request, FORM_KEPT, kept)
        return lease_workbench_form(lease)
    data = QueryDict(mutable=True)
    for key, values in kept["data"].items():
        data.setlist(key, values)
    form = lease_workbench_form(lease, data)
    form.is_valid()
    for name, problems in kept["errors"].items():
        for problem in problems:
            form.add_error(name if name in form.fields and name != "__all__" else None, problem)
    return form


# --- the account's registry credentials and variables ----------------------------------------------

class RegistryCredentialForm(forms.Form):
    name = forms.CharField(label=gettext_lazy("Name"), max_length=60,
                           widget=forms.TextInput(attrs={"placeholder": "ghcr-work"}))
    server = forms.CharField(label=gettext_lazy("Registry"), max_length=300,
                             widget=forms.TextInput(attrs={"placeholder": "ghcr.io", "spellcheck": "false"}))
    username = forms.CharField(label=gettext_lazy("User name"), max_length=255)
    password = forms.CharField(label=gettext_lazy("Password or access token"), max_length=8192,
                               widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
                               help_text=gettext_lazy("Stored encrypted, never shown again; sent only to the "
                                                      "server that pulls your image."))


class AccountVariableForm(forms.Form):
    name = forms.CharField(label=gettext_lazy("Name"), max_length=200,
                           widget=forms.TextInput(attrs={"placeholder": "HF_TOKEN", "spellcheck": "false"}))
    value = forms.CharField(label=gettext_lazy("Value"), max_length=100_000, required=False, strip=False,
                            widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}))
    secret = forms.BooleanField(label=gettext_lazy("Secret: stored encrypted, never shown again"), required=False,
                                initial=True)


def _settings_page(request, **forms_with_errors):
    return render(request, "rental/settings.html", settings_context(request, **forms_with_errors), status=400)


WORKBENCH_ANCHOR = "#workbench"


@customer_view({"POST": OPERATE})
def registry_credential_create(request):
    form = RegistryCredentialForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            row = registry_credential_save(customer=request.account, name=data["name"], server=data["server"],
                                           username=data["username"], password=data["password"], now=timezone.now())
        except WorkbenchRefused as exc:
            add_problems(form, exc)
        else:
            messages.success(request, _("Registry credential “%(name)s” saved.") % {"name": row.name})
            return redirect(reverse("account_settings") + WORKBENCH_ANCHOR)
    return _settings_page(request, registry_credential_form=form)


@customer_view({"POST": OPERATE})
def registry_credential_remove(request, credential_id: int):
    try:
        if not registry_credential_delete(customer=request.account, credential_id=credential_id, now=timezone.now()):
            raise Http404
    except WorkbenchRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _("Registry credential deleted."))
    return redirect(reverse("account_settings") + WORKBENCH_ANCHOR)


@customer_view({"POST": OPERATE})
def account_variable_create(request):
    form = AccountVariableForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            row = account_variable_set(customer=request.account, name=data["name"], value=data["value"],
                                       secret=data["secret"], now=timezone.now())
        except WorkbenchRefused as exc:
            add_problems(form, exc)
        else:
            messages.success(request, _("%(name)s saved: leases you order from now on get it.") % {"name": row.name})
            return redirect(reverse("account_settings") + WORKBENCH_ANCHOR)
    return _settings_page(request, account_variable_form=form)


@customer_view({"POST": OPERATE})
def account_variable_remove(request, variable_id: int):
    if not account_variable_delete(customer=request.account, variable_id=variable_id, now=timezone.now()):
        raise Http404
    messages.success(request, _("Deleted. Leases ordered before keep their copy."))
    return redirect(reverse("account_settings") + WORKBENCH_ANCHOR)
