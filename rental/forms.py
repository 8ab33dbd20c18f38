from django import forms
from django.contrib.auth.forms import UserCreationForm
from django.contrib.auth.models import User
from django.utils.translation import gettext_lazy as _

from .accounts.usernames import validate_username_distinct
from .models import ADDON_LIMITS_TB, ApiScope


class SignupForm(UserCreationForm):
    """A username and a password; the e-mail is optional and only used for reminders."""

    email = forms.EmailField(
        label=_("E-mail (optional)"), required=False,
        help_text=_("Only for renewal reminders. No identity checks, ever."),
    )

    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username", "email")

    def clean_username(self):
        username = super().clean_username()
        if username:
            validate_username_distinct(username)
        return username


# --- ordering -----------------------------------------------------------------------------

ADDON_FIELDS = tuple(ADDON_LIMITS_TB)


def default_image(images):
    """The operator's PyTorch image for the vendor, else the first one listed (a template that
    runs its own image and command, e.g. Jupyter's, is chosen only by name)."""
    images = list(images)
    return min(images, key=lambda i: (bool(i.image_ref), "pytorch" not in i.slug, i.name)) if images else None


class WriteOnlyTextarea(forms.Textarea):
    """A text area that never renders what was typed into it: a secret goes from the browser
    to the server once, and no page sends it back (not even the order page shown again with
    an error)."""

    def format_value(self, value):
        return None


class OrderForm(forms.Form):
    """Site, term, add-ons, image and SSH key for one offer. `stock` maps site code → free
    units; only those sites are offered, but any active site validates so that a site sold
    out since the page was drawn reaches checkout and gets the "just sold out" answer."""

    site = forms.CharField(label=_("Site"), widget=forms.Select)
    term = forms.ChoiceField(label=_("Term"), widget=forms.RadioSelect)
    extra_nvme_tb = forms.IntegerField(label=_("Extra local NVMe (TB)"), min_value=0,
                                       max_value=ADDON_LIMITS_TB["extra_nvme_tb"], initial=0)
    network_volume_tb = forms.IntegerField(label=_("Network volume (TB)"), min_value=0,
                                           max_value=ADDON_LIMITS_TB["network_volume_tb"], initial=0,
                                           help_text=_("Created when the order is paid and mounted in the instance at "
                                                       "/volumes; it is yours beyond this lease, renewed every 30 "
                                                       "days from your balance (My storage)."))
    image = forms.ModelChoiceField(label=_("Image"), queryset=None, to_field_name="slug", empty_label=None)
    saved_key = forms.ModelChoiceField(label=_("Saved SSH key"), queryset=None, required=False,
                                       empty_label=_("— paste a key below —"))
    ssh_public_key = forms.CharField(
        label=_("SSH public key"), widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}), required=False,
        help_text=_("ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa with at least 2048 bits."))
    # Off unless ticked — an order changes the account only where the customer asks
    # (a pasted key is often a one-off: a CI runner's, a colleague's); saving is one tick here.
    save_key = forms.BooleanField(label=_("Save this key to my account for later orders"), required=False)
    pay_from_balance = forms.BooleanField(label=_("Pay from balance"), required=False)
    restore_from = forms.ModelChoiceField(
        label=_("Start from snapshot"), queryset=None, required=False, empty_label=_("— an empty disk —"),
        help_text=_("The new disk starts as a copy of the snapshot (same site; it must fit the disk)."))

    # -- the workbench (rental.workbench): all optional; checked together in clean() --------
    image_ref = forms.CharField(label=_("Or your own image"), required=False, max_length=300,
                                widget=forms.TextInput(attrs={"placeholder": "ghcr.io/org/name:tag",
                                                              "spellcheck": "false", "autocapitalize": "off"}),
                                help_text=_("A public registry image (or a private one with a credential below) "
                                            "instead of the template's; it needs /bin/sh, SSH is added for you."))
    registry_credential = forms.ModelChoiceField(label=_("Registry credential"), queryset=None, required=False,
                                                 empty_label=_("— a public image —"))
    start_command = forms.CharField(label=_("Start command"), required=False,
                                    widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
                                    help_text=_("Run with /bin/sh -c in /workspace beside SSH. Empty: the "
                                                "template's own (none for your own image)."))
    env = forms.CharField(label=_("Environment variables"), required=False,
                          widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false",
                                                       "placeholder": "HF_HOME=/workspace/hf"}),
                          help_text=_("One NAME=value a line; your account's variables are added."))
    secrets = forms.CharField(label=_("Secrets"), required=False, widget=WriteOnlyTextarea(
        attrs={"rows": 2, "spellcheck": "false", "autocomplete": "off", "placeholder": "HF_TOKEN=hf_…"}),
        help_text=_("One NAME=value a line, passed to the instance like variables but stored encrypted and never "
                    "shown again (retype them if this page reports a problem)."))
    ports = forms.CharField(label=_("Ports to publish"), required=False,
                            widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false",
                                                         "placeholder": "8888\n6006:203.0.113.0/24"}),
                            help_text=_("One container TCP port a line, optionally with the networks allowed to "
                                        "reach it (PORT:CIDR,CIDR); without networks, anyone. Empty: the "
                                        "template's ports."))

    def __init__(self, *args, offer, stock: dict[str, int], sites, images, customer=None, **kwargs):
        super().__init__(*args, **kwargs)
        from .models import RegistryCredential, Snapshot, SshKey, Term

        credentials = RegistryCredential.objects.filter(customer=customer) if customer is not None \
            else RegistryCredential.objects.none()
        self.fields["registry_credential"].queryset = credentials
        self.customer = customer

        snapshots = (Snapshot.objects.filter(customer=customer, state=Snapshot.State.AVAILABLE,
                                             key_destroyed_at__isnull=True).exclude(restic_snapshot="")
                     .select_related("site") if customer is not None else Snapshot.objects.none())
        self.fields["restore_from"].queryset = snapshots
        self.fields["restore_from"].label_from_instance = lambda s: _(
            "#%(id)s of lease #%(lease)s at %(site)s, %(at)s UTC") % {
            "id": s.pk, "lease": s.source_lease_id, "site": s.site.code, "at": f"{s.ready_at:%Y-%m-%d %H:%M}"}
        if not snapshots.exists():
            del self.fields["restore_from"]

        saved = SshKey.objects.filter(customer=customer) if customer is not None else SshKey.objects.none()
        self.fields["saved_key"].queryset = saved
        latest = saved.first()
        if latest is not None:
            self.fields["saved_key"].initial = latest.pk  # the newest saved key, unless another is chosen
        else:
            del self.fields["saved_key"]

        self.active_sites = {s.code: s for s in sites}
        self.fields["site"].widget.choices = [
            (code, _("%(code)s %(city)s — %(n)d free") % {"code": code, "city": self.active_sites[code].name, "n": n})
            for code, n in sorted(stock.items()) if code in self.active_sites]
        self.fields["term"].choices = Term.choices
        self.fields["image"].queryset = images
        first = default_image(images)
        self.fields["image"].initial = first.slug if first else None
        self.fields["term"].initial = Term.MONTH
        if stock:
            self.fields["site"].initial = max(stock, key=stock.get)
        self.offer = offer

    def clean_site(self):
        code = self.cleaned_data["site"]
        if code not in self.active_sites:
            raise forms.ValidationError(_("Choose one of the listed sites."), code="site")
        return self.active_sites[code]

    def clean(self):
        """The lease gets a copy of the chosen saved key, or of the pasted one (pasted wins)."""
        from .validators import validate_ssh_public_key

        data = super().clean()
        pasted, saved = data.get("ssh_public_key", ""), data.get("saved_key")
        data["key_pasted"] = bool(pasted.strip()) or saved is None
        if data["key_pasted"]:
            try:
                data["ssh_public_key"] = validate_ssh_public_key(pasted)
            except forms.ValidationError as exc:
                if exc.code == "ssh_private":  # never shown back in the page it was pasted into
                    self.data = self.data.copy()
                    self.data["ssh_public_key"] = ""
                self.add_error("ssh_public_key", exc)
        else:
            data["ssh_public_key"] = saved.public_key
        return data

    def key_to_save(self) -> str:
        """The pasted key, when the customer asked to save it (not a saved key chosen again)."""
        data = self.cleaned_data
        return data["ssh_public_key"] if data.get("save_key") and data.get("key_pasted") else ""

    def addons(self) -> dict[str, int]:
        return {name: self.cleaned_data.get(name) or 0 for name in ADDON_FIELDS}


# --- account settings ---------------------------------------------------------------------

class SettingsForm(forms.Form):
    email = forms.EmailField(label=_("E-mail for reminders (optional)"), required=False,
                             help_text=_("Reminders 3 days and 1 day before a lease ends, and renewal invoices. "
                                         "Leave empty for in-app notices only."))
    auto_renew = forms.BooleanField(label=_("Auto-renew from balance when it covers the renewal"), required=False)
    idle_notices = forms.BooleanField(label=_("Tell me when a lease's GPUs have been idle"), required=False,
                                      help_text=_("One notice per idle stretch, by e-mail and webhook (lease.idle)."))


class SshKeyForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=60, required=False,
                           widget=forms.TextInput(attrs={"placeholder": _("e.g. home-pc")}),
                           help_text=_("Empty: the key's own comment."))
    public_key = forms.CharField(label=_("SSH public key"), max_length=16384,
                                 widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}))


class ApiTokenForm(forms.Form):
    name = forms.CharField(label=_("Token name"), max_length=60,
                           widget=forms.TextInput(attrs={"placeholder": _("e.g. training-cluster")}))
    scopes = forms.MultipleChoiceField(label=_("What it may do"), choices=ApiScope.choices, initial=["read"],
                                       required=False, widget=forms.CheckboxSelectMultiple,
                                       help_text=_("Give a token only what its job needs; none ticked means read."))

    def clean_scopes(self):
        return self.cleaned_data["scopes"] or [ApiScope.READ]
