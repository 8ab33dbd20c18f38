"""Admin: each site's Ceph cluster (the key as a password field, never shown back), and
read-only views of what the storefront created there."""
from django import forms
from django.contrib import admin

from .models import NodeStorageKey, OrderedVolume, S3Account, StorageCluster, VolumeStore


class StorageClusterForm(forms.ModelForm):
    client_key = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False),
                                 help_text="cephx secret; leave blank to keep the current one, or to use "
                                           "CEPH_KEY_<SITE> from the environment")

    class Meta:
        model = StorageCluster
        fields = ["site", "mon_host", "client_name", "client_key", "fs_name", "subvolume_group", "rgw_endpoint"]

    def clean_client_key(self):
        return self.cleaned_data["client_key"] or (self.instance.client_key if self.instance.pk else "")


@admin.register(StorageCluster)
class StorageClusterAdmin(admin.ModelAdmin):
    form = StorageClusterForm
    list_display = ("site", "mon_host", "health", "min_pool_size", "full", "checked_at", "alert")
    readonly_fields = ("checked_at", "health", "min_pool_size", "full", "alert")


@admin.register(VolumeStore)
class VolumeStoreAdmin(admin.ModelAdmin):
    list_display = ("subvolume", "volume", "state", "quota_bytes", "simulated", "attempts", "last_error")
    list_filter = ("state", "simulated")
    readonly_fields = [f.name for f in VolumeStore._meta.fields]


@admin.register(NodeStorageKey)
class NodeStorageKeyAdmin(admin.ModelAdmin):
    list_display = ("node", "auth_id", "granted", "dirty", "updated_at", "last_error")
    exclude = ("key",)
    readonly_fields = ("node", "auth_id", "granted", "dirty", "updated_at", "last_error")


@admin.register(S3Account)
class S3AccountAdmin(admin.ModelAdmin):
    list_display = ("uid", "customer", "site", "quota_gb", "bytes_stored", "state", "simulated")
    readonly_fields = ("uid", "customer", "site", "bytes_stored", "metered_at", "billed_at", "unbilled_byte_seconds")


@admin.register(OrderedVolume)
class OrderedVolumeAdmin(admin.ModelAdmin):
    """The order page's volume add-ons: created, or refunded as not created (and why)."""
    list_display = ("lease", "size_tb", "cents", "state", "volume", "created_at", "settled_at", "reason")
    list_filter = ("state",)
    readonly_fields = [f.name for f in OrderedVolume._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
