from django import forms
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .models import GpuModel, Interconnect, Site
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

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        links, sites = cached_by_generation("filter-choices", (), _filter_choices)
        # Cached untranslated (one copy for every language); the demo texts are in the catalog.
        self.fields["link"].choices = [("", _("Any")), *((slug, f"{gettext(link)} — {gettext(cards)}")
                                                         for slug, link, cards in links)]
        self.fields["site"].choices = [("", _("All sites")), *sites]


def _filter_choices() -> tuple[list, list]:
    """The link and site choices (cached with the catalog: saves of either bump it)."""
    return ([(i.slug, i.link, i.cards) for i in Interconnect.objects.all()],
            [(s.code, str(s)) for s in Site.objects.filter(is_active=True)])
