from urllib.parse import urlencode

from django import forms
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .models import GpuModel, Site
from .selectors import cached_by_generation


class CatalogFilterForm(forms.Form):
    """Every field optional; the same form serves plain GET links and htmx requests."""

    min_vram = forms.IntegerField(label=_("Min VRAM (GB)"), required=False, min_value=1, max_value=2000)
    vendor = forms.ChoiceField(label=_("Vendor"), required=False,
                               choices=[("", _("Any"))] + list(GpuModel.Vendor.choices))
    link = forms.ChoiceField(label=_("Card-to-card link"), required=False)
    site = forms.ChoiceField(label=_("Site"), required=False)
    max_price = forms.IntegerField(label=_("Max $/month"), required=False, min_value=1, max_value=10_000_000)
    in_stock = forms.BooleanField(label=_("In stock only"), required=False)
    sort = forms.ChoiceField(label=_("Sort by"), required=False, choices=[
        ("", _("Model")), ("price", _("Price, lowest first")), ("-price", _("Price, highest first")),
        ("per_gb", _("Price per GB of VRAM")), ("-per_gb", _("Price per GB of VRAM, highest first")),
        ("-vram", _("Most VRAM first")), ("vram", _("Least VRAM first")), ("-free", _("Most free first")),
        ("free", _("Fewest free first"))])

    def query_without_sort(self) -> str:
        """This filter as a query string, for the table's sort links."""
        if not self.is_bound or not self.is_valid():
            return ""
        data = {k: v for k, v in self.cleaned_data.items() if k != "sort" and v not in (None, "", False)}
        return urlencode({k: ("on" if v is True else v) for k, v in data.items()})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        links, sites = cached_by_generation("filter-choices", (), _filter_choices)
        # Cached untranslated (one copy for every language); the demo texts are in the catalog.
        self.fields["link"].choices = [("", _("Any")), *((slug, f"{gettext(link)} — {cards}")
                                                         for slug, link, cards in links)]
        self.fields["site"].choices = [("", _("All sites")), *sites]


def _filter_choices() -> tuple[list, list]:
    """The link types actually sold, each named with the cards sold over it (cards with an
    active offer: the link table's own `cards` text also names cards this store does not
    sell), and the sites; cached with the catalog: saves of either bump it."""
    sold = (GpuModel.objects.filter(offers__is_active=True).select_related("interconnect")
            .order_by("interconnect__sort", "interconnect__slug", "sort", "name"))
    cards_by_link: dict = {}
    for gpu in sold:  # one row per active offer: a card with single and multi-GPU offers comes twice
        names = cards_by_link.setdefault(gpu.interconnect, [])
        if gpu.name not in names:
            names.append(gpu.name)
    return ([(link.slug, link.link, ", ".join(names)) for link, names in cards_by_link.items()],
            [(s.code, str(s)) for s in Site.objects.filter(is_active=True)])
