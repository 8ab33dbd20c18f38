from django import forms
from django.contrib.auth.forms import UserCreationForm
from django.contrib.auth.models import User
from django.utils.translation import gettext_lazy as _


class SignupForm(UserCreationForm):
    """A username and a password; the e-mail is optional and only used for reminders."""

    email = forms.EmailField(
        label=_("E-mail (optional)"), required=False,
        help_text=_("Only for renewal reminders. No identity checks, ever."),
    )

    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username", "email")
