from django.contrib import admin, messages
from django.db.models import Count, Exists, OuterRef, Q

from .models import AuditEntry, GpuModel, GpuSlot, Interconnect, Node, Offer, Site, SlotAllocation, StorageProduct
from .selectors import nodes_with_free_counts
from .services import node_set_draining


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ("code", "name", "region", "infiniband", "is_active")
    list_filter = ("is_active", "infiniband", "region")
    search_fields = ("code", "name")


@admin.register(Interconnect)
class InterconnectAdmin(admin.ModelAdmin):
    list_display = ("link", "cards", "bandwidth", "sharding", "sort")
    list_filter = ("sharding",)
    search_fields = ("cards", "link")


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = ("name", "vendor", "vram_gb", "memory_type", "interconnect", "fp8", "included_nvme_gb", "free_now")
    list_filter = ("vendor", "fp8", "interconnect")
    search_fields = ("name", "slug")

    def get_queryset(self, request):
        open_alloc = SlotAllocation.objects.filter(slot=OuterRef("pk"), released_at__isnull=True)
        free = GpuSlot.objects.filter(in_service=True, node__draining=False).exclude(Exists(open_alloc))
        return super().get_queryset(request).annotate(
            _free=Count("nodes__slots", filter=Q(nodes__slots__in=free), distinct=True)
        )

    @admin.display(description="free now", ordering="_free")
    def free_now(self, obj):
        return obj._free


@admin.register(Offer)
class OfferAdmin(admin.ModelAdmin):
    list_display = ("display_name", "gpu_model", "gpu_count", "weekly_cents", "monthly_cents", "is_active")
    list_filter = ("is_active", "gpu_count", "gpu_model__vendor")
    search_fields = ("slug", "name", "gpu_model__name")
    list_select_related = ("gpu_model",)


class GpuSlotInline(admin.TabularInline):
    model = GpuSlot
    extra = 0


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "site", "gpu_model", "gpu_count", "free_slots", "vcpus", "host_ram_gb", "draining")
    list_filter = ("site", "gpu_model", "draining")
    search_fields = ("name",)
    readonly_fields = ("draining",)
    inlines = [GpuSlotInline]
    actions = ["drain", "undrain"]

    def get_queryset(self, request):
        return nodes_with_free_counts()

    @admin.display(description="free", ordering="free")
    def free_slots(self, obj):
        return obj.free

    @admin.action(description="Drain: take no new leases on the selected nodes")
    def drain(self, request, queryset):
        for node in queryset:
            node_set_draining(node=node, draining=True, actor=request.user, reason="admin action")
        self.message_user(request, f"{queryset.count()} node(s) draining.", messages.SUCCESS)

    @admin.action(description="Undrain: take new leases again")
    def undrain(self, request, queryset):
        for node in queryset:
            node_set_draining(node=node, draining=False, actor=request.user, reason="admin action")
        self.message_user(request, f"{queryset.count()} node(s) back in service.", messages.SUCCESS)


@admin.register(SlotAllocation)
class SlotAllocationAdmin(admin.ModelAdmin):
    list_display = ("slot", "lease_id", "allocated_at", "released_at")
    list_filter = (("released_at", admin.EmptyFieldListFilter),)
    search_fields = ("lease_id", "slot__node__name")
    list_select_related = ("slot__node",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(StorageProduct)
class StorageProductAdmin(admin.ModelAdmin):
    list_display = ("kind", "cents_per_tb_month", "included_tb", "max_tb")


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ("at", "actor", "action", "object_type", "object_id")
    list_filter = ("action", "object_type")
    search_fields = ("object_id", "action")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
