"""Shared admin building blocks. Audit trails and chain-reported records are viewable in
the admin but never added, changed or deleted there: writes go through services."""
from django.contrib import admin
from django.contrib.auth import get_permission_codename


class ReadOnlyAdmin(admin.ModelAdmin):
    """No edit form for anyone. An action that runs a service on these records declares
    `permissions=["operate"]`: it needs the model's change permission, which
    has_change_permission cannot answer here (it is False so that no form edits them)."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_operate_permission(self, request):
        return request.user.has_perm(f"{self.opts.app_label}.{get_permission_codename('change', self.opts)}")


class ReadOnlyInlineMixin:
    """For inlines: every listed field read-only, no rows added or deleted."""

    extra = 0
    can_delete = False

    def get_readonly_fields(self, request, obj=None):
        return self.fields or ()

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False
