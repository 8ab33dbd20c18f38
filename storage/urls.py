"""The customer's storage page, mounted with `path("storage/mine/", include("storage.urls"))`."""
from django.urls import path

from . import pages as v
from . import views as ceph

app_name = "storage_mine"

urlpatterns = [
    path("", v.index, name="index"),
    path("volumes/", v.volume_create, name="volume_create"),
    path("volumes/<int:volume_id>/attach/", v.volume_attach_view, name="volume_attach"),
    path("volumes/<int:volume_id>/detach/<int:lease_id>/", v.volume_detach_view, name="volume_detach"),
    path("volumes/<int:volume_id>/delete/", v.volume_delete, name="volume_delete"),
    path("volumes/<int:volume_id>/grow/", ceph.volume_grow, name="volume_grow"),
    path("objects/", ceph.s3_open, name="s3_open"),
    path("objects/<int:account_id>/keys/", ceph.s3_key_new, name="s3_key_new"),
    path("objects/keys/<int:key_id>/rotate/", ceph.s3_key_rotate_view, name="s3_key_rotate"),
    path("objects/keys/<int:key_id>/revoke/", ceph.s3_key_revoke_view, name="s3_key_revoke"),
    path("snapshots/", v.snapshot_create, name="snapshot_create"),
    path("snapshots/<int:snapshot_id>/delete/", v.snapshot_delete, name="snapshot_delete"),
]
